"""Files inside a sandbox, moved by its kernel host beside the kernel.

Every operation acts with the sandbox user's permissions (the host's ``read_file`` /
``write_file`` / ``exec`` promise that).  Relative paths resolve against the sandbox's
working directory.  Binary-safe.  Every operation, whoever calls it, is reported to the
sandbox's listeners as a :class:`~kernel_sandbox.events.FileOperated` event carrying
the caller's :func:`~kernel_sandbox.events.call_context`, so a notebook recorder sees
direct ``sandbox.files.write()`` calls as well as tool calls.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .errors import FileOperationError, SandboxFileNotFoundError
from .events import FileOperated, current_context, emit
from .results import FileInfo, format_size

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox

__all__ = ["AsyncFiles"]

T = TypeVar("T")

_TYPES = {"f": "file", "d": "directory", "l": "symlink"}
# Exit statuses of the helper scripts below.
_MISSING, _NOT_DIR = 3, 4
#: Longest ``detail`` (what was read, a listing) put into a FileOperated event.
EVENT_DETAIL_CHARS = 2000

_LIST = (
    'test -e "$1" || exit 3; test -d "$1" || exit 4; '
    "find \"$1\" -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%f\\n'"
)
_REMOVE = 'test -e "$1" || test -L "$1" || exit 3; rm -rf -- "$1"'


class AsyncFiles:
    """``sandbox.files``: read, write, list and move files in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def _sh(self, script: str, path: str) -> tuple[int, str, str]:
        result = await self._sandbox.host.exec(["sh", "-c", script, "sh", path])
        return (
            result.exit_code,
            result.stdout.decode(errors="replace"),
            result.stderr.decode(errors="replace"),
        )

    def _fail(self, code: int, path: str, stderr: str, action: str) -> FileOperationError:
        if code == _MISSING:
            return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {path}")
        if code == _NOT_DIR:
            return FileOperationError(f"not a directory: {path}")
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
        return FileOperationError(f"cannot {action} {path}: {detail}")

    def _full(self, path: str, size: int) -> FileOperationError:
        config = self._sandbox.config
        budget = config.disk_budget()
        places = {"working_dir": config.working_dir, "home": "$HOME", "tmp": "/tmp"}
        split = ", ".join(f"{format_size(budget[k])} for {name}" for k, name in places.items())
        return FileOperationError(
            f"cannot write {path} ({format_size(size)}): the sandbox's writable area is full "
            "(no space left on device). Delete files in the sandbox, or raise disk_limit "
            f"(now {config.disk_limit!r}: {split})"
        )

    async def _reported(
        self,
        operation: str,
        path: str,
        action: Callable[[str], Awaitable[T]],
        *,
        content: bytes | str | None = None,
        describe: Callable[[T], tuple[int | None, str]] = lambda _: (None, ""),
    ) -> T:
        """Run ``action(full path)`` and report it as a FileOperated event, failed or not."""
        sb = self._sandbox
        sb.check_open()
        started = time.time()
        full = sb.resolve_path(path)
        try:
            value = await action(full)
        except FileOperationError as exc:
            await emit(
                sb.listeners,
                FileOperated(
                    sb.id, operation, full, started, error=str(exc),
                    metadata=current_context(), content=content,
                )
            )  # fmt: skip
            raise
        size, detail = describe(value)
        await emit(
            sb.listeners,
            FileOperated(
                sb.id, operation, full, started, size=size, detail=detail[:EVENT_DETAIL_CHARS],
                metadata=current_context(), content=content,
            )
        )  # fmt: skip
        return value

    async def _read(self, full: str) -> bytes:
        return await self._sandbox.host.read_file(full, self._sandbox.config.max_file_bytes)

    async def _write(self, full: str, payload: bytes) -> None:
        try:
            await self._sandbox.host.write_file(full, payload)
        except FileOperationError as exc:
            if "no space left on device" in str(exc).lower():
                raise self._full(full, len(payload)) from exc
            if "read-only file system" in str(exc).lower() and "writable)" not in str(exc):
                raise FileOperationError(
                    f"{exc} (only the working directory, $HOME, /tmp and the sandbox's "
                    "volumes are writable)"
                ) from exc
            raise

    async def read(self, path: str) -> bytes:
        """The bytes of a file; one over ``config.max_file_bytes`` is refused, unread."""
        return await self._reported("read", path, self._read, describe=_describe_bytes)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file decoded as text."""
        data = await self.read(path)
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise FileOperationError(
                f"{path} is not valid {encoding} text ({exc.reason} at byte {exc.start}); "
                "read it as bytes or give another encoding"
            ) from exc

    async def write(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Create or replace a file (parent directories are created)."""
        payload = data.encode(encoding) if isinstance(data, str) else data

        async def write(full: str) -> int:
            await self._write(full, payload)
            return len(payload)

        await self._reported("write", path, write, content=payload, describe=_describe_size)

    async def append(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Add to the end of a file, creating it if needed."""
        payload = data.encode(encoding) if isinstance(data, str) else data

        async def append(full: str) -> int:
            try:
                existing = await self._read(full)
            except SandboxFileNotFoundError:
                existing = b""
            await self._write(full, existing + payload)
            return len(existing) + len(payload)

        await self._reported("append", path, append, content=payload, describe=_describe_size)

    async def list(self, path: str = ".") -> list[FileInfo]:
        """Entries of a directory, sorted by name."""

        async def listing(full: str) -> list[FileInfo]:
            code, out, err = await self._sh(_LIST, full)
            if code != 0:
                raise self._fail(code, full, err, "list")
            entries = []
            for line in out.splitlines():
                kind, size, name = line.split("\t", 2)
                entries.append(FileInfo(name, _TYPES.get(kind, "other"), int(size)))  # type: ignore[arg-type]
            return sorted(entries, key=lambda e: e.name)

        return await self._reported("list", path, listing, describe=_describe_listing)

    async def exists(self, path: str) -> bool:
        """True when the path exists (file, directory or anything else)."""

        async def exists(full: str) -> bool:
            code, _, _ = await self._sh('test -e "$1"', full)
            return code == 0

        return await self._reported(
            "exists", path, exists, describe=lambda found: (None, str(found).lower())
        )

    async def remove(self, path: str) -> None:
        """Delete a file, or a directory with everything in it (reported as ``delete``)."""

        async def remove(full: str) -> None:
            code, _, err = await self._sh(_REMOVE, full)
            if code != 0:
                raise self._fail(code, full, err, "remove")

        await self._reported("delete", path, remove)

    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents; an existing directory is fine."""

        async def mkdir(full: str) -> None:
            code, _, err = await self._sh('mkdir -p -- "$1"', full)
            if code != 0:
                raise self._fail(code, full, err, "create directory")

        await self._reported("mkdir", path, mkdir)

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a host file into the sandbox (reported as a write)."""
        await self.write(remote, Path(local).read_bytes())

    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a sandbox file to the host (parent directories are created)."""
        data = await self.read(remote)
        target = Path(local)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _describe_bytes(data: bytes) -> tuple[int | None, str]:
    return len(data), data[:EVENT_DETAIL_CHARS].decode(errors="replace")


def _describe_size(size: int) -> tuple[int | None, str]:
    return size, ""


def _describe_listing(entries: list[FileInfo]) -> tuple[int | None, str]:
    return len(entries), "\n".join(e.name for e in entries)
