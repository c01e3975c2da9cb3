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

``read_stream``/``write_stream`` move a file of any size up to a cap without holding
it (:meth:`~kernel_sandbox.backends.base.KernelHost.exec_stream`); a streamed write
goes to a temporary name beside the target, renamed over it once whole.

Every operation, whoever calls it, is reported to the sandbox's listeners as a
:class:`~kernel_sandbox.events.FileOperated` event carrying the caller's
:func:`~kernel_sandbox.events.call_context`, so a notebook recorder sees direct
``sandbox.files.write()`` calls as well as tool calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import file_scripts as sh
from .errors import FileOperationError, SandboxFileNotFoundError
from .events import FileOperated, current_context, emit
from .limits import (
    EVENT_DETAIL_CHARS,
    FILE_OP_DEADLINE,
    FILE_OP_RATE,
    FILE_STREAM_QUEUE,
    LIST_ENTRY_BYTES,
    LIST_LIMIT,
    PSEUDO_FILE_BYTES,
    STREAM_EVENT_CONTENT,
)
from .results import FileInfo, format_size
from .transfer import AsyncReadStream, download_file, finished, once, stop, upload_file

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox

__all__ = ["EVENT_DETAIL_CHARS", "LIST_LIMIT", "STREAM_EVENT_CONTENT", "AsyncFiles"]

T = TypeVar("T")
_Done = tuple[int, bytes, str]  # a script's exit status, stdout and stderr

_TYPES: dict[str, Literal["file", "directory", "symlink"]] = {
    "f": "file",
    "d": "directory",
    "l": "symlink",
}


class AsyncFiles:
    """``sandbox.files``: read, write, list and move files in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def _sh(
        self,
        script: str,
        path: str,
        *args: str,
        stdin: bytes | AsyncIterable[bytes] | None = None,
        stdout: Callable[[bytes], Awaitable[None]] | None = None,
        max_output_bytes: int = 1 << 16,
        drain: bool = False,
        moved: int = 0,
    ) -> _Done:
        """Run ``script`` as the sandbox user with ``$1`` = path; (status, stdout, stderr).

        The host's protected paths are refused first; ``drain`` makes a refusal read
        its input first (a write).  Chunked ``stdin`` or a ``stdout`` sink streams
        (``moved``: the most bytes that may pass, for the deadline).
        """
        host = self._sandbox.host
        argv = ["sh", "-c", sh.prelude(host.protected_paths, drain) + script, "sh", path, *args]
        if stdout is None and (stdin is None or isinstance(stdin, bytes)):
            moved = len(stdin or b"") + max_output_bytes
            result = await host.exec(
                argv,
                max_output_bytes=max_output_bytes,
                stdin=stdin,
                deadline=FILE_OP_DEADLINE + moved / FILE_OP_RATE,
            )
        else:
            chunks = once(stdin) if isinstance(stdin, bytes) else stdin

            async def kept(piece: bytes) -> None:
                out.append(piece)

            out: list[bytes] = []
            result = await host.exec_stream(
                argv,
                stdin=chunks,
                stdout=stdout or kept,
                max_output_bytes=max_output_bytes,
                deadline=FILE_OP_DEADLINE + moved / FILE_OP_RATE,
            )
            result = type(result)(result.exit_code, b"".join(out), result.stderr)
        return result.exit_code, result.stdout, result.stderr.decode(errors="replace")

    def _fail(self, code: int, path: str, stderr: str, action: str) -> FileOperationError:
        if code == sh.MISSING:
            return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {path}")
        if code == sh.NOT_DIR:
            return FileOperationError(f"not a directory: {path}")
        if code == sh.IS_DIR:
            return FileOperationError(f"is a directory, not a file: {path}")
        if code == sh.NOT_FILE:
            return FileOperationError(
                f"not a regular file: {path} (devices, FIFOs and sockets are not read or "
                "written through the file API)"
            )
        if code == sh.PROTECTED:
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

    async def _emit(self, operation: str, full: str, started: float, **fields: Any) -> None:
        """Report a file operation (done or failed) to the sandbox's listeners."""
        sb = self._sandbox
        event = FileOperated(sb.id, operation, full, started, metadata=current_context(), **fields)
        await emit(sb.listeners, event)

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
            await self._emit(operation, full, started, error=str(exc), content=content)
            raise
        size, detail = describe(value)
        await self._emit(
            operation, full, started, size=size, detail=detail[:EVENT_DETAIL_CHARS], content=content
        )
        return value

    async def read(self, path: str) -> bytes:
        """The bytes of a file; one over ``config.max_file_bytes`` is refused, unread.

        Read as the sandbox user: a file it may not read is refused as it would be
        inside.  Links are followed as they would be inside.
        """
        return await self._reported("read", path, self._read, describe=_describe_bytes)

    async def _read(self, full: str) -> bytes:
        limit = self._sandbox.config.max_file_bytes
        code, out, err = await self._sh(sh.READ, full, str(limit), max_output_bytes=limit + 1)
        if code == sh.TOO_LARGE:
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
            code, _, err = await self._sh(sh.WRITE, full, mode, stdin=payload, drain=True)
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
                sh.LIST, full, str(limit + 1), max_output_bytes=(limit + 1) * LIST_ENTRY_BYTES
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
            code, _, err = await self._sh(sh.REMOVE, full)
            if code != 0:
                raise self._fail(code, full, err, "remove")

        await self._reported("delete", path, remove)

    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents; an existing directory is fine."""

        async def mkdir(full: str) -> None:
            code, _, err = await self._sh(sh.MKDIR, full)
            if code != 0:
                raise self._fail(code, full, err, "create directory")

        await self._reported("mkdir", path, mkdir)

    async def read_stream(self, path: str, max_bytes: int | None = None) -> AsyncReadStream:
        """A file as a stream: open (refusals raise here), its ``size``, then its bytes.

        Nothing is gathered on the host: each piece is handed on as the sandbox sends
        it, and the sandbox waits while the consumer does.  Files over ``max_bytes``
        (default ``config.max_file_bytes``) are refused unread; one that grows or
        shrinks while read fails the stream (the consumer sees an error, never a
        silently different file).  A file that says it has 0 bytes (the kernel's
        ``/proc`` and ``/sys`` files) is read to its end, at most ``PSEUDO_FILE_BYTES``.
        Iterate it once, or ``close()`` it.
        """
        sb = self._sandbox
        sb.check_open()
        started, full = time.time(), sb.resolve_path(path)
        limit = max_bytes or sb.config.max_file_bytes
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(FILE_STREAM_QUEUE)
        reading = self._sh(sh.READ_STREAM, full, str(limit), stdout=queue.put, moved=limit)
        task = asyncio.ensure_future(finished(reading, queue))
        try:
            size, rest = await self._stream_size(full, queue, task)
        except BaseException as exc:
            await stop(task)
            if isinstance(exc, FileOperationError):
                await self._emit("read", full, started, error=str(exc))
            raise

        # /proc's and /sys's files say 0 bytes and hold some: such a file is read to its
        # end (at most PSEUDO_FILE_BYTES), a file of known size must keep it.
        sized = size > 0
        bound = size if sized else min(limit, PSEUDO_FILE_BYTES)

        async def body() -> AsyncIterator[bytes]:
            sent, head = 0, bytearray()
            try:
                piece: bytes | None = rest
                while piece is not None:
                    sent += len(piece)
                    if sent > bound:
                        if not sized:
                            raise FileOperationError(
                                f"{full} says it has 0 bytes and holds more than "
                                f"{format_size(bound)} (PSEUDO_FILE_BYTES): read it with the shell"
                            )
                        raise FileOperationError(f"{full} grew while read (past {size} bytes)")
                    if piece:
                        head += piece[: EVENT_DETAIL_CHARS - len(head)]
                        yield piece
                    piece = await queue.get()
                code, _, err = await task
                if code != 0:
                    raise self._fail(code, full, err, "read")
                if sized and sent != size:
                    raise FileOperationError(f"{full} shrank while read ({sent} of {size} bytes)")
            except FileOperationError as exc:
                await self._emit("read", full, started, error=str(exc))
                raise
            finally:
                await stop(task)
            await self._emit("read", full, started, size=sent, detail=head.decode(errors="replace"))

        return AsyncReadStream(size, body())

    async def _stream_size(
        self, full: str, queue: asyncio.Queue[bytes | None], task: asyncio.Future[_Done]
    ) -> tuple[int, bytes]:
        """The size line a streamed read starts with, and the bytes that came after it."""
        header = b""
        while b"\n" not in header:
            piece = await queue.get()
            if piece is None:  # it ended before the file was open: a refusal
                code, _, err = await task
                if code == sh.TOO_LARGE:
                    size = err.strip().splitlines()[-1] if err.strip() else ""
                    raise self._too_large(full, int(size) if size.isdigit() else None)
                raise self._fail(code or 1, full, err, "read")
            header += piece
            if len(header) > 64 and b"\n" not in header:
                raise FileOperationError(f"cannot read {full}: the sandbox sent no size")
        line, rest = header.split(b"\n", 1)
        return int(line), rest

    async def write_stream(
        self,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        append: bool = False,
        max_bytes: int | None = None,
    ) -> int:
        """Create or replace (``append``: add to) a file from chunks as they come.

        The bytes go to a temporary file beside the target, renamed over it only once
        all came and fit in ``max_bytes`` (default ``config.max_file_bytes``; more is
        refused): a failed, refused or abandoned transfer leaves the file as it was.
        Returns the bytes written.
        """
        sb = self._sandbox
        sb.check_open()
        started, full = time.time(), sb.resolve_path(path)
        limit = max_bytes or sb.config.max_file_bytes
        operation = "append" if append else "write"
        base = posixpath.basename(full)[:200]
        temp = posixpath.join(posixpath.dirname(full), f".{base}.{secrets.token_hex(6)}.part")
        received, head = 0, bytearray()

        async def counted() -> AsyncIterator[bytes]:
            nonlocal received
            async for chunk in chunks:
                received += len(chunk)
                if received > limit:
                    return  # the process sees the end; the temporary file is discarded
                if len(head) <= STREAM_EVENT_CONTENT:
                    head.extend(chunk[: STREAM_EVENT_CONTENT + 1 - len(head)])
                yield chunk

        try:
            code, _, err = await self._sh(
                sh.WRITE_TEMP, full, temp, operation, stdin=counted(), drain=True, moved=limit
            )
            if received > limit:
                raise FileOperationError(
                    f"cannot {operation} {full}: more than {format_size(limit)} was sent "
                    "(the transfer's cap); nothing was changed"
                )
            if code == 0:
                code, _, err = await self._sh(sh.COMMIT, full, temp)
            if code != 0:
                if "no space left on device" in err.lower():
                    raise self._full(full, received)
                raise self._fail(code, full, err, operation)
        except BaseException as exc:
            with contextlib.suppress(Exception):  # the first error is the news
                await self._sh('rm -f -- "$2"', full, temp)
            if isinstance(exc, FileOperationError):
                await self._emit(operation, full, started, error=str(exc))
            raise
        content = bytes(head) if received <= STREAM_EVENT_CONTENT else None
        await self._emit(operation, full, started, size=received, content=content)
        return received

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a host file into the sandbox, streamed (reported as a write)."""
        await upload_file(self, local, remote)

    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a sandbox file to the host, streamed (parent directories are created)."""
        await download_file(self, remote, local)


def _describe_bytes(data: bytes) -> tuple[int | None, str]:
    return len(data), data[:EVENT_DETAIL_CHARS].decode(errors="replace")


def _describe_listing(entries: list[FileInfo]) -> tuple[int | None, str]:
    return len(entries), "\n".join(e.name for e in entries)


if TYPE_CHECKING:  # mypy holds the local files to the seam
    from .protocols import FilesLike

    def _is_files_like(files: AsyncFiles) -> FilesLike:
        return files
