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
from .manager import (
    DockerSandboxConfig,
    LocalSandboxManager,
    SandboxInfo,
    SandboxManager,
    SandboxManagerConfig,
    SandboxManagerFactory,
    SandboxStatus,
    SandboxType,
)
from .results import CommandResult, Execution, ExecutionError, FileInfo
from .sandbox import AsyncSandbox
from .sync import Files, Sandbox
from .tools import ToolResult, ToolSet

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_IMAGE",
    "AsyncFiles",
    "AsyncSandbox",
    "CommandResult",
    "ConfigError",
    "DockerSandboxConfig",
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
    "LocalSandboxManager",
    "PythonExecuted",
    "Sandbox",
    "SandboxClosedError",
    "SandboxConfig",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxInfo",
    "SandboxManager",
    "SandboxManagerConfig",
    "SandboxManagerFactory",
    "SandboxNotFoundError",
    "SandboxStartError",
    "SandboxStatus",
    "SandboxType",
    "ShellExecuted",
    "ToolResult",
    "ToolSet",
    "__version__",
]
