"""Files inside a sandbox, moved by processes that run as the sandbox user beside the kernel.

Every operation is a process the kernel host runs in the sandbox *as the sandbox user*
(:meth:`~kernel_sandbox.backends.base.KernelHost.exec`): a write streams the bytes into
``cat``'s stdin, a read takes ``head``'s stdout, so nothing is checked as one user and
done as another (an engine's archive API works as root: a path swapped for a link
between the check and the extraction, or a file the user may not read, would be root's
business).  The host's ``protected_paths`` (with Docker, the run directory holding the
kernel's sockets and the supervisor's status) are refused whatever link leads there.
Every output is capped and every call has a deadline on the host.  Relative paths
resolve against the sandbox's working directory.  Binary-safe.

Every operation, whoever calls it, is reported to the sandbox's listeners as a
:class:`~kernel_sandbox.events.FileOperated` event carrying the caller's
:func:`~kernel_sandbox.events.call_context`, so a notebook recorder sees direct
``sandbox.files.write()`` calls as well as tool calls.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from .errors import FileOperationError, SandboxFileNotFoundError
from .events import FileOperated, current_context, emit
from .results import FileInfo, format_size

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox

__all__ = ["EVENT_DETAIL_CHARS", "LIST_LIMIT", "AsyncFiles"]

T = TypeVar("T")

_TYPES: dict[str, Literal["file", "directory", "symlink"]] = {
    "f": "file",
    "d": "directory",
    "l": "symlink",
}
# Exit statuses of the helper scripts below.
_MISSING, _NOT_DIR, _IS_DIR, _PROTECTED, _NOT_FILE, _TOO_LARGE = 3, 4, 5, 6, 7, 8
#: Most entries :meth:`AsyncFiles.list` returns; a larger directory is refused.
LIST_LIMIT = 10_000
#: Seconds any file operation may take on top of moving its bytes (at 10 MB/s):
#: a process the sandbox stops or blocks (a FIFO) never holds the host longer.
_DEADLINE = 60.0
_RATE = 10e6
#: Longest ``detail`` (what was read, a listing) put into a FileOperated event.
EVENT_DETAIL_CHARS = 2000

# ``fail`` exits with a status; a write's ``fail`` first drains its input: the engine
# resets a connection whose input was not read, and the reason would be lost.
_EXIT = 'fail() { exit "$1"; }; '
# Sizes come from find, not coreutils' stat: gVisor's runsc of 2022-12 refuses the statx
# flag that coreutils 9 passes (AT_NO_AUTOMOUNT) with EINVAL.
_READ = (
    f'test -e "$1" || exit {_MISSING}; test -d "$1" && exit {_IS_DIR}; '
    f'test -f "$1" || exit {_NOT_FILE}; s=$(find -L "$1" -prune -printf %s) || exit 1; '
    f'if [ "$s" -gt "$2" ]; then echo "$s" >&2; exit {_TOO_LARGE}; fi; '
    # one byte more than allowed tells a file that grew since (or lied about its size)
    'exec head -c "$(($2 + 1))" -- "$1"'
)
_WRITE = (
    f'test -d "$1" && fail {_IS_DIR}; test -e "$1" && ! test -f "$1" && fail {_NOT_FILE}; '
    'mkdir -p -- "$(dirname -- "$1")" || fail 1; '
    'if [ "$2" = append ]; then cat >> "$1" || fail $?; else cat > "$1" || fail $?; fi'
)
# '/' separates the fields and NUL ends an entry: neither can be in a file name.
_LIST = (
    f'test -e "$1" || exit {_MISSING}; test -d "$1" || exit {_NOT_DIR}; '
    'find "$1" -mindepth 1 -maxdepth 1 -printf \'%y/%s/%f\\0\' | head -zn "$2"'
)
_REMOVE = f'test -e "$1" || test -L "$1" || exit {_MISSING}; rm -rf -- "$1"'
_MKDIR = 'mkdir -p -- "$1"'
#: Bytes of one listed entry at most: type, size, a 255-byte name, separators.
_ENTRY_BYTES = 300


def _guard(protected: tuple[str, ...]) -> str:
    """Shell that refuses ``$1`` when it resolves into one of ``protected``."""
    if not protected:
        return ""
    cases = "|".join(f"{shlex.quote(p)}|{shlex.quote(p)}/*" for p in protected)
    return (
        'r=$(realpath -m -- "$1" 2>/dev/null || readlink -f -- "$1"); '
        f'case "$r" in {cases}) fail {_PROTECTED};; esac; '
    )


class AsyncFiles:
    """``sandbox.files``: read, write, list and move files in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def _sh(
        self,
        script: str,
        path: str,
        arg: str = "",
        *,
        stdin: bytes | None = None,
        max_output_bytes: int = 1 << 16,
        drain: bool = False,
    ) -> tuple[int, bytes, str]:
        """Run ``script`` as the sandbox user with ``$1`` = path; (status, stdout, stderr).

        The host's protected paths are refused first; ``drain`` makes a refusal read
        its input first (a write).
        """
        host = self._sandbox.host
        prelude = ('fail() { cat >/dev/null; exit "$1"; }; ' if drain else _EXIT) + _guard(
            host.protected_paths
        )
        moved = len(stdin or b"") + max_output_bytes
        result = await host.exec(
            ["sh", "-c", prelude + script, "sh", path, arg],
            max_output_bytes=max_output_bytes,
            stdin=stdin,
            deadline=_DEADLINE + moved / _RATE,
        )
        return result.exit_code, result.stdout, result.stderr.decode(errors="replace")

    def _fail(self, code: int, path: str, stderr: str, action: str) -> FileOperationError:
        if code == _MISSING:
            return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {path}")
        if code == _NOT_DIR:
            return FileOperationError(f"not a directory: {path}")
        if code == _IS_DIR:
            return FileOperationError(f"is a directory, not a file: {path}")
        if code == _NOT_FILE:
            return FileOperationError(
                f"not a regular file: {path} (devices, FIFOs and sockets are not read or "
                "written through the file API)"
            )
        if code == _PROTECTED:
            places = ", ".join(self._sandbox.host.protected_paths)
            return FileOperationError(
                f"cannot {action} {path}: it is in {places}, the sandbox's kernel "
                "connection, which the file API never touches"
            )
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
        if "read-only file system" in detail.lower():
            detail += (
                " (only the working directory, $HOME, /tmp and the sandbox's volumes are writable)"
            )
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

    def _too_large(self, path: str, size: int | None) -> FileOperationError:
        limit = self._sandbox.config.max_file_bytes
        what = f"{path} is {format_size(size)}" if size is not None else f"{path} grew past that"
        return FileOperationError(
            f"{what}; files are read whole into memory and the limit is {format_size(limit)} "
            "(SandboxConfig.max_file_bytes): read a part with the shell (head -c, tail -c, "
            "split) or raise max_file_bytes"
        )

    async def _reported(
        self,
        operation: str,
        path: str,
        action: Callable[[str], Awaitable[T]],
        *,
        content: bytes | None = None,
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
            event = FileOperated(
                sb.id, operation, full, started, error=str(exc), content=content,
                metadata=current_context(),
            )  # fmt: skip
            await emit(sb.listeners, event)
            raise
        size, detail = describe(value)
        event = FileOperated(
            sb.id, operation, full, started, size=size, detail=detail[:EVENT_DETAIL_CHARS],
            content=content, metadata=current_context(),
        )  # fmt: skip
        await emit(sb.listeners, event)
        return value

    async def read(self, path: str) -> bytes:
        """The bytes of a file; one over ``config.max_file_bytes`` is refused, unread.

        Read as the sandbox user: a file it may not read is refused as it would be
        inside.  Links are followed as they would be inside.
        """
        return await self._reported("read", path, self._read, describe=_describe_bytes)

    async def _read(self, full: str) -> bytes:
        limit = self._sandbox.config.max_file_bytes
        code, out, err = await self._sh(_READ, full, str(limit), max_output_bytes=limit + 1)
        if code == _TOO_LARGE:
            size = err.strip().splitlines()[-1] if err.strip() else ""
            raise self._too_large(full, int(size) if size.isdigit() else None)
        if code != 0:
            raise self._fail(code, full, err, "read")
        if len(out) > limit:
            raise self._too_large(full, None)
        return out

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
        await self._put(path, data, encoding, "write")

    async def append(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Add to the end of a file, creating it if needed."""
        await self._put(path, data, encoding, "append")

    async def _put(self, path: str, data: bytes | str, encoding: str, mode: str) -> None:
        payload = data.encode(encoding) if isinstance(data, str) else data

        async def put(full: str) -> int:
            code, _, err = await self._sh(_WRITE, full, mode, stdin=payload, drain=True)
            if code == 0:
                return len(payload)
            if "no space left on device" in err.lower():
                if mode == "write":
                    # Remove the half-written file, so that the space comes back and no
                    # truncated file passes for the real one.
                    with contextlib.suppress(FileOperationError):  # the first error is the news
                        await self._sh('rm -f -- "$1"', full)
                raise self._full(full, len(payload))
            raise self._fail(code, full, err, "write")

        await self._reported(mode, path, put, content=payload, describe=lambda n: (n, ""))

    async def list(self, path: str = ".", limit: int = LIST_LIMIT) -> list[FileInfo]:
        """Entries of a directory, sorted by name; more than ``limit`` are refused."""

        async def listing(full: str) -> list[FileInfo]:
            code, out, err = await self._sh(
                _LIST, full, str(limit + 1), max_output_bytes=(limit + 1) * _ENTRY_BYTES
            )
            if code != 0:
                raise self._fail(code, full, err, "list")
            records = out.split(b"\0")[:-1]
            if len(records) > limit:
                raise FileOperationError(
                    f"{full} holds more than {limit} entries; list a part with the shell "
                    "(e.g. `ls | head`) or pass a larger limit"
                )
            entries = []
            for record in records:
                kind, size, name = record.split(b"/", 2)
                kind_name = _TYPES.get(kind.decode(), "other")
                entries.append(FileInfo(name.decode(errors="replace"), kind_name, int(size)))  # type: ignore[arg-type]
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
            code, _, err = await self._sh(_MKDIR, full)
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


def _describe_listing(entries: list[FileInfo]) -> tuple[int | None, str]:
    return len(entries), "\n".join(e.name for e in entries)
