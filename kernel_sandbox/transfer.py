"""Files moved as streams, between the host and a sandbox, local or remote.

A file larger than the host would like to hold moves through here: the sandbox side
(:meth:`~kernel_sandbox.files.AsyncFiles.read_stream` / ``write_stream``, and the same
methods of :class:`~kernel_sandbox.client.remote.RemoteFiles` over HTTP) hands on
pieces as they come, and the host side reads or writes its file a chunk at a time.
:func:`upload_file` and :func:`download_file` are the one implementation of
``files.upload`` / ``files.download`` for both: a download goes to a temporary name
beside the target and is renamed over it only once whole, so a failed one leaves
nothing partial behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .threads import in_thread

__all__ = ["CHUNK", "AsyncReadStream", "download_file", "upload_file"]

T = TypeVar("T")
#: Bytes read from a host file at a time for an upload.
CHUNK = 1 << 20


class AsyncReadStream:
    """A file being read from a sandbox: its ``size`` is known, its bytes come as sent.

    Iterate it once (``async for piece in stream``) or ``close()`` it (also an async
    context manager): an abandoned stream stops the transfer in the sandbox.
    """

    def __init__(self, size: int, chunks: AsyncIterator[bytes]) -> None:
        #: Bytes the file has (the stream fails if it sends another number); 0 also for
        #: a file that says 0 and holds some (``/proc``'s), read to its end.
        self.size = size
        self._chunks = chunks

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def close(self) -> None:
        """Stop reading; the sandbox's side of the transfer ends."""
        aclose = getattr(self._chunks, "aclose", None)
        if aclose is not None:
            await aclose()

    async def __aenter__(self) -> AsyncReadStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class StreamingFiles(Protocol):
    """What :func:`upload_file` and :func:`download_file` need of a ``files``."""

    async def read_stream(self, path: str, max_bytes: int | None = None) -> AsyncReadStream: ...

    async def write_stream(
        self,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        append: bool = False,
        max_bytes: int | None = None,
    ) -> int: ...


async def upload_file(files: StreamingFiles, local: str | Path, remote: str) -> int:
    """Copy a host file into the sandbox a chunk at a time; the bytes written."""
    return await files.write_stream(remote, host_chunks(Path(local)))


async def host_chunks(path: Path, chunk: int = CHUNK) -> AsyncIterator[bytes]:
    """A host file's bytes, read in a worker thread a chunk at a time."""
    with path.open("rb") as handle:
        while data := await in_thread(handle.read, chunk):
            yield data


async def download_file(files: StreamingFiles, remote: str, local: str | Path) -> int:
    """Copy a sandbox file to the host a piece at a time (parent directories are made).

    The bytes go to a hidden temporary file beside ``local``, renamed over it once all
    came; on any failure it is removed and ``local`` is untouched.  The bytes copied.
    """
    target = Path(local)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.part")
    try:
        async with await files.read_stream(remote) as stream:
            with temp.open("xb") as handle:
                async for piece in stream:
                    await in_thread(handle.write, piece)
                written = handle.tell()
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return written


async def once(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as a stream of one chunk."""
    yield data


async def finished(run: Awaitable[T], queue: asyncio.Queue[bytes | None]) -> T:
    """``run``'s outcome, after putting None in ``queue``: its reader learns the end.

    When cancelled (the reader left, nobody reads the queue) nothing is put.
    """
    try:
        value = await run
    except asyncio.CancelledError:
        raise
    except BaseException:
        await queue.put(None)
        raise
    await queue.put(None)
    return value


async def stop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` if it still runs, and wait for it to end."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
