"""The named seams: what a sandbox, its files and a manager offer, wherever they run.

:class:`~kernel_sandbox.AsyncSandbox` (a kernel on a host here) and
:class:`~kernel_sandbox.client.RemoteSandbox` (a sandbox of a ``kernel-sandbox serve``
server) both satisfy :class:`SandboxLike`; the recorder, the tools, the agent loop,
replay and the sync facade take a ``SandboxLike``, so each works on either.
:class:`ManagerLike` is the same for ms-enclave's manager API:
:class:`~kernel_sandbox.SandboxManager` and
:class:`~kernel_sandbox.client.HttpSandboxManager`.

What only a local sandbox has — its kernel host, its labels, the connection file of its
kernel, its extra kernels (contexts), adoption — is not part of the seam: code that
needs it asks for an ``AsyncSandbox``.  mypy checks that every implementation satisfies
its protocol (an ``if TYPE_CHECKING:`` check at the end of each implementing module).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self

if TYPE_CHECKING:
    from .config import SandboxConfig
    from .contexts import Context
    from .events import Listener
    from .kernel.client import OutputCallback
    from .manager_models import SandboxInfo, SandboxStatus, SandboxType
    from .results import CommandResult, Execution, FileInfo
    from .snapshots import Snapshot, SnapshotStore
    from .tools.results import ToolResult
    from .transfer import AsyncReadStream

__all__ = ["FilesLike", "ManagerLike", "SandboxLike"]


class FilesLike(Protocol):
    """Files in a sandbox (``sandbox.files``): paths relative to its working directory."""

    async def read(self, path: str) -> bytes: ...
    async def read_text(self, path: str, encoding: str = "utf-8") -> str: ...
    async def write(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None: ...
    async def append(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None: ...
    async def list(self, path: str = ".", limit: int = ...) -> list[FileInfo]: ...
    async def exists(self, path: str) -> bool: ...
    async def remove(self, path: str) -> None: ...
    async def mkdir(self, path: str) -> None: ...
    async def read_stream(self, path: str, max_bytes: int | None = None) -> AsyncReadStream: ...
    async def write_stream(
        self,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        append: bool = False,
        max_bytes: int | None = None,
    ) -> int: ...
    async def upload(self, local: str | Path, remote: str) -> None: ...
    async def download(self, remote: str, local: str | Path) -> None: ...


class SandboxLike(Protocol):
    """A stateful sandbox: one persistent kernel, with shell and files beside it.

    Errors in the user's code come back as data (:class:`~kernel_sandbox.Execution`,
    :class:`~kernel_sandbox.CommandResult`); only misuse raises ``SandboxError``.
    """

    @property
    def id(self) -> str:
        """Short random id, also in the names and labels of what runs the sandbox."""

    @property
    def config(self) -> SandboxConfig:
        """The settings the sandbox was started with."""

    @property
    def image(self) -> str:
        """The image the kernel runs in."""

    @property
    def created_at(self) -> float:
        """When this handle was made (``time.time()``)."""

    @property
    def container_id(self) -> str | None:
        """The engine's id of what runs the sandbox, when this process can see it."""

    @property
    def listeners(self) -> list[Listener]:
        """Called with every :mod:`~kernel_sandbox.events` event (append to listen)."""

    @property
    def files(self) -> FilesLike:
        """The sandbox's files."""

    @property
    def working_dir(self) -> str:
        """Where relative paths start."""

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""

    def check_open(self) -> None:
        """Raise ``SandboxClosedError`` once the sandbox can no longer be used."""

    def resolve_path(self, path: str) -> str:
        """An absolute path in the sandbox; relative ones start at the working directory."""

    async def health(self) -> str | None:
        """None while the sandbox can run code, else a sentence saying why it cannot."""

    async def ping(self, timeout: float = ...) -> bool:
        """True when the kernel answers within ``timeout`` seconds."""

    async def run_python(
        self,
        code: str,
        timeout: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> Execution:
        """Run code in the persistent kernel (see ``AsyncSandbox.run_python``)."""

    async def run_code(
        self,
        code: str,
        language: str | None = None,
        *,
        context: Context | str | None = None,
        timeout: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> Execution:
        """Run code in a kernel of the sandbox (see ``AsyncSandbox.run_code``)."""

    async def run_shell(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run a shell command beside the kernel as the sandbox user."""

    async def interrupt(self) -> None:
        """Stop the running cell; the kernel keeps its variables."""

    async def restart(self) -> None:
        """A fresh kernel: variables are gone, files stay."""

    async def close(self) -> None:
        """Remove the sandbox.  Safe twice."""

    async def detach(self) -> None:
        """Let go of the sandbox without removing it (it runs on, to be adopted)."""

    async def snapshot(
        self,
        name: str | None = None,
        exact: bool | None = None,
        *,
        store: SnapshotStore | None = None,
        tmp: bool = False,
        max_bytes: int = ...,
    ) -> Snapshot:
        """Save the sandbox's state (it runs on); see ``AsyncSandbox.snapshot``."""

    async def fork(self, n: int, *, store: SnapshotStore | None = None) -> Sequence[SandboxLike]:
        """``n`` new sandboxes, each restored from a snapshot of this one."""

    async def pause(self, *, store: SnapshotStore | None = None, tmp: bool = True) -> Snapshot:
        """Snapshot, then stop the sandbox; ``resume`` with its id brings it back."""

    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, *exc_info: object) -> None: ...


class ManagerLike(Protocol):
    """ms-enclave's manager API: sandboxes by id, and tool calls into them."""

    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, *exc_info: object) -> None: ...

    async def start(self) -> None:
        """Get ready to create sandboxes."""

    async def stop(self) -> None:
        """Remove the sandboxes this manager created, then let go of its resources."""

    async def create_sandbox(
        self,
        sandbox_type: SandboxType | str = ...,
        config: SandboxConfig | dict[str, Any] | None = None,
        sandbox_id: str | None = None,
    ) -> str:
        """Start a sandbox; returns its id."""

    async def get_sandbox(self, sandbox_id: str) -> SandboxLike:
        """The sandbox behind an id (``SandboxNotFoundError`` for an unknown one)."""

    async def get_sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        """Status, image and tools of one sandbox."""

    async def list_sandboxes(self, status_filter: SandboxStatus | None = None) -> list[SandboxInfo]:
        """The sandboxes this manager (or its key) may see."""

    async def stop_sandbox(self, sandbox_id: str) -> bool:
        """Stop a sandbox (its record is kept)."""

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Remove a sandbox."""

    async def cleanup_all_sandboxes(self) -> None:
        """Remove every sandbox this manager created."""

    async def get_sandbox_tools(self, sandbox_id: str) -> dict[str, Any]:
        """``{name: OpenAI function schema}`` of the sandbox's tools."""

    async def execute_tool(
        self, sandbox_id: str, tool_name: str, parameters: dict[str, Any] | None
    ) -> ToolResult:
        """Run one tool call; failures of the call are ``status="error"`` results."""

    async def get_stats(self) -> dict[str, Any]:
        """Counts of sandboxes by status, and what kind of manager this is."""
