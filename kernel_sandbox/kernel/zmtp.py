"""The outer ZMTP 3 framing, read on the way to count what a connection carries.

Frame sizes are visible whatever the security mechanism: under CURVE each frame is sent
as a MESSAGE command whose size is the frame's plus ``CURVE_OVERHEAD``.  The guard
(``guard.py``) charges each frame its bytes plus ``FRAME_COST``; the client reports the
same charge for each message it receives (:func:`charge`).  Also: what a ZMQ URL
names as a plain socket address (:func:`socket_address`).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

__all__ = [
    "CURVE_OVERHEAD",
    "FRAME_COST",
    "GREETING",
    "Framing",
    "FramingError",
    "charge",
    "socket_address",
]

#: Charged per frame on top of its bytes: libzmq keeps a 64-byte ``msg_t`` for each
#: frame queued, so a message of a million empty frames is not free.
FRAME_COST = 64
#: CURVE sends a frame as a MESSAGE command: name (8), nonce (8), MAC (16), flags (1).
CURVE_OVERHEAD = 33
#: A ZMTP 3 greeting (signature, version, mechanism, as-server, filler).
GREETING = 64

_MORE, _LONG, _COMMAND = 1, 2, 4


def socket_address(url: str) -> tuple[int, str | tuple[str, int]]:
    """The socket family and address of a ZMQ ``ipc://`` or ``tcp://`` URL."""
    if url.startswith("ipc://"):
        return socket.AF_UNIX, url[len("ipc://") :]
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://") :].rpartition(":")
        return socket.AF_INET, (host, int(port))
    raise ValueError(f"the guard relays ipc:// and tcp:// only, not {url!r}")


def charge(frames: Sequence[bytes]) -> int:
    """What a message of ``frames`` counts against a route's bound."""
    return sum(map(len, frames)) + FRAME_COST * len(frames)


class FramingError(ValueError):
    """The kernel's byte stream is not ZMTP 3 (a sandbox could speak an older framing)."""


class Framing:
    """Incremental reader of the outer ZMTP 3 framing: what each chunk charges."""

    def __init__(self, curve: bool) -> None:
        self.overhead = CURVE_OVERHEAD if curve else 0
        self.greeting = b""
        self.header = b""  # an incomplete frame header (flags and size)
        self.body_left = 0

    def feed(self, data: bytes | memoryview) -> int:
        """The charge of the frames that start in ``data`` (``data`` is not kept)."""
        charged = 0
        i, n = 0, len(data)
        if len(self.greeting) < GREETING:
            i = GREETING - len(self.greeting)
            self.greeting += bytes(data[:i])
            if len(self.greeting) < GREETING:
                return 0
            if self.greeting[0] != 0xFF or self.greeting[10] < 3:
                raise FramingError("the kernel did not greet with ZMTP 3")
        while i < n:
            if self.body_left:
                step = min(self.body_left, n - i)
                self.body_left -= step
                i += step
                continue
            if self.header:  # rare: a header split between two reads
                data = self.header + data[i:]
                i, n = 0, len(data)
                self.header = b""
            flags = data[i]
            if flags & ~(_MORE | _LONG | _COMMAND):
                raise FramingError(f"bad ZMTP frame flags {flags:#x}")
            end = i + (9 if flags & _LONG else 2)
            if end > n:
                self.header = bytes(data[i:])
                break
            size = int.from_bytes(data[i + 1 : end], "big")
            charged += max(size - self.overhead, 0) + FRAME_COST
            self.body_left = size
            i = end
        return charged
