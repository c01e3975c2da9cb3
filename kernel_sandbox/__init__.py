"""kernel_sandbox: safe, stateful code sandboxes for LLM agents.

Each sandbox is a container running persistent Jupyter kernels (IPython by default;
R, JavaScript/TypeScript, bash or any kernelspec the image holds) reached over
jupyter_client.  The public API is re-exported here; everything else is internal.
"""

from .config import DEFAULT_IMAGE, SandboxConfig
from .contexts import Context, KernelSpecInfo
from .errors import (
    AccessDeniedError,
    CapacityError,
    ConfigError,
    ContainerRemovedError,
    ContainerStoppedError,
    ContextNotFoundError,
    EngineUnavailableError,
    FileOperationError,
    FileOperationTimeoutError,
    ImageError,
    ImageNotFoundError,
    KernelError,
    MissingExtraError,
    NotebookError,
    ResumeDivergedError,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxStartError,
    SnapshotError,
    SnapshotNotFoundError,
)
from .events import (
    ContextChanged,
    EgressRefused,
    Event,
    FileOperated,
    KernelRestarted,
    PythonExecuted,
    ShellExecuted,
    call_context,
)
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
from .snapshots import LocalSnapshotStore, Restored, Snapshot, SnapshotStore
from .sync import Files, Sandbox
from .tools import Tool, ToolResult, ToolSet, register_tool

__version__ = "0.1.0"

# Heavier parts (the openai SDK, nbconvert) load on first use, so that importing the
# package, and every CLI command, stays fast.
_LAZY = {
    "Agent": "agent",
    "AgentResult": "agent",
    "AgentSession": "agent",
    "Budget": "agent",
    "RetryPolicy": "agent",
    "NotebookRecorder": "notebook",
    "ReplayReport": "notebook",
    "Rebuilt": "notebook",
    "Rewound": "notebook",
    "Tolerance": "notebook",
    "export_notebook": "notebook",
    "replay": "notebook",
    "areplay": "notebook",
    "rewind": "notebook",
    "arewind": "notebook",
    "rebuild": "notebook",
    "arebuild": "notebook",
    "SandboxPool": "pool",
    "RemoteSandbox": "client.remote",
    "RemoteSnapshots": "client.remote",
    "HttpSandboxManager": "client.manager",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_IMAGE",
    "AccessDeniedError",
    "Agent",
    "AgentResult",
    "AgentSession",
    "AsyncFiles",
    "AsyncSandbox",
    "Budget",
    "CapacityError",
    "CommandResult",
    "ConfigError",
    "ContainerRemovedError",
    "ContainerStoppedError",
    "Context",
    "ContextChanged",
    "ContextNotFoundError",
    "DockerSandboxConfig",
    "EgressRefused",
    "EngineUnavailableError",
    "Event",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FileOperated",
    "FileOperationError",
    "FileOperationTimeoutError",
    "Files",
    "HttpSandboxManager",
    "ImageError",
    "ImageNotFoundError",
    "KernelError",
    "KernelRestarted",
    "KernelSpecInfo",
    "LocalSandboxManager",
    "LocalSnapshotStore",
    "MissingExtraError",
    "NotebookError",
    "NotebookRecorder",
    "PythonExecuted",
    "Rebuilt",
    "RemoteSandbox",
    "RemoteSnapshots",
    "ReplayReport",
    "Restored",
    "ResumeDivergedError",
    "RetryPolicy",
    "Rewound",
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
    "SandboxPool",
    "SandboxStartError",
    "SandboxStatus",
    "SandboxType",
    "ShellExecuted",
    "Snapshot",
    "SnapshotError",
    "SnapshotNotFoundError",
    "SnapshotStore",
    "Tolerance",
    "Tool",
    "ToolResult",
    "ToolSet",
    "__version__",
    "arebuild",
    "areplay",
    "arewind",
    "call_context",
    "export_notebook",
    "rebuild",
    "register_tool",
    "replay",
    "rewind",
]
