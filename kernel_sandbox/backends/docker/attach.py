"""The engine's multiplexed exec/attach stream, read without losing its first frames.

Without a TTY the engine sends a process's stdout and stderr on one hijacked
connection, as frames: an 8-byte header (stream id, 3 zero bytes, big-endian payload
size) and then the payload.

docker-py reads these frames from the *raw* socket under the HTTP response.  But
http.client read the response headers through a buffered reader, and when the host
is slow to read them (a loaded machine, many threads), the process's first frames
have already arrived and sit in that buffer, where the raw socket never sees them: a
short command then "succeeds" with empty output (docker/docker-py#2042, #3332).  Here
the frames are read from that buffered reader itself, so nothing the engine sent is
skipped.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

__all__ = ["STDERR", "STDOUT", "TruncatedStreamError", "attach_body", "read_frames"]

STDOUT = 1
STDERR = 2
_HEADER = struct.Struct(">BxxxL")
#: Largest piece of a frame handed on at once: a huge frame streams in pieces.
_CHUNK = 64 * 1024


class TruncatedStreamError(EOFError):
    """The connection ended inside a frame: the engine went away mid-stream."""


def attach_body(response: Any) -> io.BufferedReader:
    """The buffered reader of a hijacked exec/attach HTTP response.

    ``response`` is the requests response of ``exec_start(stream=True)``; its
    urllib3 response wraps http.client's, whose ``fp`` read the headers and holds
    whatever came with them.
    """
    body: io.BufferedReader = response.raw._fp.fp
    return body


def read_frames(body: io.BufferedIOBase) -> Iterator[tuple[int, bytes]]:
    """``(stream id, bytes)`` pieces of the multiplexed stream until the engine closes it.

    A frame's payload is handed on as it arrives (``read1``: one read of the socket
    at most), so a process that prints for a long time streams instead of being held
    until its frame is whole.  An end of stream between frames is the normal end; one
    inside a frame raises :class:`TruncatedStreamError` rather than passing off a
    partial output as the whole.
    """
    while True:
        header = body.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise TruncatedStreamError(
                f"the engine closed the output stream inside a frame header "
                f"({len(header)} of {_HEADER.size} bytes)"
            )
        stream, size = _HEADER.unpack(header)
        while size:
            piece = body.read1(min(size, _CHUNK))
            if not piece:
                raise TruncatedStreamError(
                    f"the engine closed the output stream with {size} bytes of a frame unsent"
                )
            size -= len(piece)
            yield stream, piece
