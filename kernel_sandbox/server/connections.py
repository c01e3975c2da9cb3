"""What a connection may cost before anyone knows who sent it: time, head bytes, count.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) but waits for a
request head forever, however slowly it drips in and however many connections do it
("slowloris"), until the process runs out of file descriptors and keyed requests are
reset too.  :func:`guarded_protocol` makes uvicorn's own HTTP protocol (httptools)
bound all three:

- a **head deadline**: a connection has ``header_timeout`` seconds, from the moment it
  connects or its previous response ended, to send a whole request head; else closed;
- a **head size** cap: a URL and headers past ``max_head_bytes`` get a 431 and a close;
- a **connection cap**: at ``max_connections`` (kept well under the open-file limit)
  a new connection closes the oldest one that is idle or still sending its head; a
  request being served is never cut, and when every connection is serving one, the
  new connection is the one refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["connection_cap", "guarded_protocol"]

_431_BODY = b"request head (URL and headers) past the server's cap"
_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_431_BODY), _431_BODY)
)


def connection_cap(wanted: int) -> int:
    """``wanted``, kept to half the open-file limit (raised to its hard maximum first):
    the other half stays for sandboxes, the engine, notebooks and logs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return max(1, min(wanted, soft // 2))


class _HeadTooLarge(Exception):
    """Raised inside the parser to stop it once the head passed its cap."""


def guarded_protocol(
    *, header_timeout: float, max_head_bytes: int, max_connections: int
) -> type[HttpToolsProtocol]:
    """An HTTP protocol class for ``uvicorn.run(http=...)`` with the bounds above."""
    live: dict[Guarded, None] = {}  # insertion order: the oldest connection first

    class Guarded(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0
            self._refused = False

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(header_timeout, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self._idle() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(live) >= max_connections:
                victim = next((c for c in live if c._idle()), None)
                if victim is None:  # every connection is being served: refuse this one
                    transport.close()
                    return
                victim.transport.close()
                live.pop(victim, None)
            live[self] = None
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            live.pop(self, None)
            self._disarm()
            super().connection_lost(exc)

        def _count(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > max_head_bytes and not self._refused:
                self._refused = True
                self.transport.write(_431)
                self.transport.close()
                raise _HeadTooLarge

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._disarm()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._refused:  # the 431 was sent already
                super().send_400_response(msg)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._idle() and not self.transport.is_closing():
                self._arm()

    return Guarded
