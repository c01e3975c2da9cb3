"""A sandbox file as an HTTP response: one way for every route that serves one.

A file of at most :data:`~kernel_sandbox.limits.DOWNLOAD_WHOLE_BYTES` is read whole
before the answer starts, so one that changes while read (``/proc/self/status`` says
0 bytes and sends a kilobyte; ``/sys`` files say 4096) is refused with the file API's
error, a 400, before any byte.  A larger file streams as the sandbox sends it; if it
changes on the way the response ends short of its ``content-length`` (the client sees
an incomplete body) and the server logs one rate-limited line, never a traceback: what
a tenant's file does must not write the server's log.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from ..errors import SandboxError
from ..kernel.wellformed import RateLimitedWarning
from ..limits import DOWNLOAD_WHOLE_BYTES
from ..transfer import AsyncReadStream

__all__ = ["CUT_SHORT", "file_response"]

log = logging.getLogger(__name__)

#: One line per 10 s for downloads that ended short (the others are counted in it).
CUT_SHORT = RateLimitedWarning(logger=log)


class _CutShortResponse(StreamingResponse):
    """A stream whose failure ends the response unfinished instead of raising."""

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                if not isinstance(chunk, bytes | memoryview):
                    chunk = chunk.encode(self.charset)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except SandboxError as exc:
            # No final message: the server closes the connection short of its length.
            CUT_SHORT.warn(f"a download ended short: {exc}")
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def file_response(stream: AsyncReadStream, held: contextlib.AsyncExitStack) -> Response:
    """The response for ``stream``; ``held`` (what the download keeps, the stream's
    close among it) is closed when the response is done, or here when it fails."""
    if stream.size <= DOWNLOAD_WHOLE_BYTES:
        async with held:
            body = b"".join([piece async for piece in stream])  # refusals raise here
        return Response(body, media_type="application/octet-stream")

    async def pieces() -> AsyncIterator[bytes]:
        async with held:
            async for piece in stream:
                yield piece

    return _CutShortResponse(
        pieces(),
        media_type="application/octet-stream",
        headers={"content-length": str(stream.size)},
    )
