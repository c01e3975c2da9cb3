"""kernel_sandbox: safe, stateful Python sandboxes for LLM agents.

Each sandbox is a container running a persistent IPython kernel reached over
jupyter_client.  The public API is re-exported here; everything else is internal.
"""

from .config import DEFAULT_IMAGE, SandboxConfig
from .errors import (
    ConfigError,
    EngineUnavailableError,
    FileOperationError,
    ImageError,
    ImageNotFoundError,
    KernelError,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxStartError,
)
from .events import Event, FileOperated, PythonExecuted, ShellExecuted
from .files import AsyncFiles
from .results import CommandResult, Execution, ExecutionError, FileInfo
from .sandbox import AsyncSandbox
from .sync import Files, Sandbox

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_IMAGE",
    "AsyncFiles",
    "AsyncSandbox",
    "CommandResult",
    "ConfigError",
    "EngineUnavailableError",
    "Event",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FileOperated",
    "FileOperationError",
    "Files",
    "ImageError",
    "ImageNotFoundError",
    "KernelError",
    "PythonExecuted",
    "Sandbox",
    "SandboxClosedError",
    "SandboxConfig",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxNotFoundError",
    "SandboxStartError",
    "ShellExecuted",
    "__version__",
]
