"""The host side of a sandbox's egress: a small HTTP proxy on a unix socket.

One proxy per sandbox, listening on a unix socket in a directory that only that
sandbox's container has mounted: the socket *is* the sandbox's identity.  It speaks
just enough HTTP/1.1 for package managers and HTTP libraries:

* ``CONNECT host:port`` — checked, then a byte tunnel (TLS stays end to end, nothing is
  intercepted);
* ``GET http://host/path`` (absolute form) — checked, then sent on with
  ``Connection: close`` and relayed.

Every request is decided before anything leaves the host: the name is matched against
the policy first (no DNS query for a name outside it), then resolved *on the host*,
every address checked (private and loopback addresses must be listed), and only then
is a connection opened — to the address that was checked, so the name cannot be
re-resolved to something else in between.  A refusal is an HTTP 403 whose reason
phrase and body say which policy refused what.

Bounds, per sandbox (:class:`EgressLimits`): connections at once and in total, bytes
both ways, the size and time of a request head, idle time.  A connection over a bound
is closed after a short answer without reading more; buffers are fixed-size reads
with backpressure, so a flood from inside costs the host a bounded amount of memory.
The resolver and connector are parameters: tests count and fake them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ....kernel.wellformed import RateLimitedWarning
from ....network.policy import Decision, EgressPolicy

__all__ = ["Connector", "Decision", "EgressLimits", "EgressProxy", "Resolver"]

log = logging.getLogger(__name__)
#: A connection that fails in an unforeseen way is the sandbox's doing: one line per
#: ``MALFORMED_WARNING_SECONDS``, never a traceback per connection.
PROXY_WARNINGS = RateLimitedWarning(logger=log)

Resolver = Callable[[str, int], Awaitable[list[str]]]
Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

_CHUNK = 64 * 1024
#: Headers not sent on: hop-by-hop ones, and ``Host``, which is set from the URL that was
#: checked (a different ``Host`` would ask the allowed server for another site).
_DROPPED_HEADERS = {
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "te",
    "host",
    "upgrade",
}


@dataclass(frozen=True)
class EgressLimits:
    """The per-sandbox caps of its proxy (the defaults fit ``pip install`` of a few
    large packages; a sandbox that hits one gets a 403 saying which)."""

    #: Connections open at once (pip opens a handful).
    max_connections: int = 32
    #: Connections over the life of the sandbox.
    max_total_connections: int = 10_000
    #: Bytes through the proxy, both ways together, over the life of the sandbox.
    max_bytes: int = 2 * 1024**3
    #: Largest request head (request line and headers).
    max_head_bytes: int = 16 * 1024
    #: Seconds a client gets to send its request head.
    head_timeout: float = 10.0
    #: Seconds to resolve a name and open the connection.
    connect_timeout: float = 20.0
    #: Seconds a tunnel may stay silent both ways before it is closed.
    idle_timeout: float = 120.0
    #: Decisions kept in memory for :attr:`EgressProxy.decisions`.
    log_entries: int = 1000


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _connect(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(address, port, limit=_CHUNK)


def _plain(text: str, limit: int, extra: str = "") -> str:
    """``text`` with anything but name characters replaced by ``?``, at most ``limit`` long."""
    kept = "".join(
        ch if ch.isascii() and (ch.isalnum() or ch in "-._:[]*'(),=/" + extra) else "?"
        for ch in text[:limit]
    )
    return kept + ("..." if len(text) > limit else "")


class _Refused(Exception):
    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status
        self.sentence = sentence


@dataclass
class _Counters:
    active: int = 0
    total: int = 0
    bytes: int = 0
    rejected: int = 0
    writers: set[asyncio.StreamWriter] = field(default_factory=set)


class EgressProxy:
    """The proxy of one sandbox; :meth:`start` binds ``socket_path``, :meth:`close` ends it.

    ``on_refusal`` is called (synchronously, it must not block) with each refusal's
    :class:`Decision`, so the sandbox can tell its notebook.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        socket_path: Path,
        *,
        limits: EgressLimits | None = None,
        resolver: Resolver = _resolve,
        connector: Connector = _connect,
        on_refusal: Callable[[Decision], None] | None = None,
        name: str = "",
    ) -> None:
        self.policy = policy
        self.socket_path = socket_path
        self.limits = limits or EgressLimits()
        self.decisions: deque[Decision] = deque(maxlen=self.limits.log_entries)
        self._resolver = resolver
        self._connector = connector
        self._on_refusal = on_refusal
        self._name = name or socket_path.parent.name
        self._count = _Counters()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def active_connections(self) -> int:
        """Connections from the sandbox open right now."""
        return self._count.active

    @property
    def bytes_relayed(self) -> int:
        """Bytes relayed both ways so far."""
        return self._count.bytes

    async def start(self) -> None:
        """Listen on the socket; connectable by the sandbox user (the directory guards it)."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(
            self._accept, path=str(self.socket_path), limit=self.limits.max_head_bytes, backlog=64
        )
        os.chmod(self.socket_path, 0o666)

    async def close(self) -> None:
        """Stop listening and cut every open connection.  Safe twice."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._count.writers):
            writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # -- one connection ------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count, limits = self._count, self.limits
        if count.active >= limits.max_connections or count.total >= limits.max_total_connections:
            which = (
                f"{limits.max_connections} connections at once"
                if count.active >= limits.max_connections
                else f"{limits.max_total_connections} connections in all"
            )
            count.rejected += 1
            if count.rejected == 1 or count.rejected % 1000 == 0:  # a flood logs little
                self._log(
                    "-",
                    0,
                    False,
                    f"connection cap reached ({which}), {count.rejected:,} "
                    "connections closed unread so far",
                    "-",
                )
            writer.transport.abort()  # no read, no answer: a flood costs nothing more
            return
        count.active += 1
        count.total += 1
        count.writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # the sandbox's doing: one line, rate-limited, no traceback
            PROXY_WARNINGS.warn(
                f"egress proxy {self._name}: connection failed ({type(exc).__name__}: "
                f"{str(exc)[:100]})"
            )
        finally:
            count.active -= 1
            count.writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.head_timeout)
        except asyncio.LimitOverrunError:
            self._log("-", 0, False, "request head too large", "-")
            await self._answer(writer, 431, "the request head is too large")
            return
        try:
            method, host, port, forward, body = self._parse(head)
            try:
                upstream_reader, upstream = await self._open(method, host, port)
            except (UnicodeError, ValueError):  # e.g. a label of 64 characters
                raise _Refused(400, f"{host[:80]!r} is not a valid host name") from None
        except _Refused as refused:
            if refused.status == 400:  # the others were logged where they were decided
                self._log("-", 0, False, refused.sentence, "-")
            await self._answer(writer, refused.status, refused.sentence)
            return
        self._count.writers.add(upstream)
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                upstream.write(forward)
            await self._pipe(reader, writer, upstream_reader, upstream, body)
        finally:
            self._count.writers.discard(upstream)
            upstream.transport.abort()

    def _parse(self, head: bytes) -> tuple[str, str, int, bytes, int | None]:
        """(method, host, port, request to send on, body bytes) of a request head.

        _Refused if bad.  The body is what the client may send after the head (None
        for a tunnel): a plain request gets its Content-Length and no more, so a second
        request pipelined behind it never reaches the upstream unchecked.
        """
        lines = head.decode("latin-1").split("\r\n")
        if any("\n" in line or "\r" in line for line in lines):
            # A bare LF is a line end to some servers and not to others: smuggling.
            raise _Refused(400, "every line of the request head must end in CRLF")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(400, "this is not an HTTP/1 proxy request")
        method, target, version = parts
        if method == "CONNECT":
            name, _, number = target.rpartition(":")
            if not name or not (number.isascii() and number.isdigit() and len(number) <= 5):
                raise _Refused(400, f"CONNECT needs host:port, got {target!r}")
            return method, name.strip("[]"), int(number), b"", None
        if not target.startswith("http://"):
            raise _Refused(
                400, "send absolute http:// URLs, or CONNECT for https (this is a proxy)"
            )
        url = urlsplit(target)
        try:
            host, port = url.hostname or "", url.port or 80
        except ValueError:
            raise _Refused(400, f"{target!r} has a bad port") from None
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        headers = [
            line
            for line in lines[1:]
            if line and line.split(":", 1)[0].strip().lower() not in _DROPPED_HEADERS
        ]
        names = [line.split(":", 1)[0].strip().lower() for line in headers]
        if "transfer-encoding" in names:
            raise _Refused(411, "send a Content-Length instead of Transfer-Encoding")
        lengths = [
            line.split(":", 1)[1].strip()
            for line in headers
            if line.split(":", 1)[0].strip().lower() == "content-length"
        ]
        if len(lengths) > 1 or not all(v.isascii() and v.isdigit() for v in lengths):
            raise _Refused(400, "a request has at most one Content-Length, a number")
        body = int(lengths[0]) if lengths else 0
        authority = url.netloc.rpartition("@")[2]  # never credentials from the URL
        request = f"{method} {path} {version}\r\nHost: {authority}\r\n" + "".join(
            f"{line}\r\n" for line in headers
        )
        forward = (request + "Connection: close\r\n\r\n").encode("latin-1")
        return method, host.lower(), port, forward, body

    async def _open(
        self, method: str, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Decide, resolve, decide again, connect — or raise _Refused with the sentence."""
        if self._count.bytes >= self.limits.max_bytes:
            self._refuse(
                method, host, port, f"the sandbox used its {self.limits.max_bytes:,} bytes"
            )
        reason = self.policy.check(host, port)
        if reason is not None:
            self._refuse(method, host, port, reason)
        try:
            addresses = [str(ipaddress.ip_address(host))]  # a literal: nothing to resolve
        except ValueError:
            addresses = []
        try:
            addresses = addresses or await asyncio.wait_for(
                self._resolver(host, port), self.limits.connect_timeout
            )
        except (TimeoutError, OSError) as exc:
            self._log(host, port, False, f"cannot resolve: {exc}", method)
            raise _Refused(502, f"{host} cannot be resolved") from None
        reason = self.policy.check(host, port, addresses)
        if reason is not None:
            self._refuse(method, host, port, reason)
        address = addresses[0]
        try:
            opened = await asyncio.wait_for(
                self._connector(address, port), self.limits.connect_timeout
            )
        except (TimeoutError, OSError) as exc:
            self._log(host, port, False, f"cannot connect to {address}: {exc}", method)
            raise _Refused(502, f"{host}:{port} cannot be reached") from None
        self._log(host, port, True, address, method)
        return opened

    def _refuse(self, method: str, host: str, port: int, reason: str) -> None:
        decision = self._log(host, port, False, reason, method)
        if self._on_refusal is not None:
            try:
                self._on_refusal(decision)
            except Exception:
                log.warning("egress refusal listener failed", exc_info=True)
        raise _Refused(
            403,
            f"refused by the sandbox's network policy ({self.policy.label}): {reason}; "
            f"allowed: {self.policy.allowed_text()}",
        )

    def _log(self, host: str, port: int, allowed: bool, detail: str, method: str) -> Decision:
        # names come from the sandbox: keep them short and plain for logs and notebooks
        host, method = _plain(host, 255), _plain(method, 16)
        decision = Decision(time.time(), host, port, allowed, _plain(detail, 700, " "), method)
        self.decisions.append(decision)
        log.info(
            "egress %s %s %s:%s %s (%s)",
            self._name,
            "allow" if allowed else "refuse",
            host,
            port,
            method,
            detail,
        )
        return decision

    async def _answer(self, writer: asyncio.StreamWriter, status: int, sentence: str) -> None:
        phrase = sentence.encode("ascii", "replace").replace(b"\r", b" ").replace(b"\n", b" ")
        body = phrase + b"\n"
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"X-Kernel-Sandbox-Egress: refused\r\nConnection: close\r\n\r\n%s"
            % (status, phrase, len(body), body)
        )
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.drain(), self.limits.head_timeout)

    async def _pipe(
        self,
        client_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        client_bytes: int | None = None,
    ) -> None:
        """Relay both ways until both ends are done, idle too long or over the byte cap.

        ``client_bytes``: at most this much goes from the client to the upstream (the
        request's body); what the client sends after it is never read.
        """
        last = [time.monotonic()]

        async def one_way(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, left: int | None = None
        ) -> None:
            while True:
                chunk = await src.read(_CHUNK if left is None else min(_CHUNK, left))
                if left is not None:
                    left -= len(chunk)
                if not chunk:
                    with contextlib.suppress(OSError):
                        if dst.can_write_eof():
                            dst.write_eof()
                    return
                self._count.bytes += len(chunk)
                if self._count.bytes > self.limits.max_bytes:
                    self._log("-", 0, False, "byte cap reached; connection cut", "-")
                    raise ConnectionAbortedError
                last[0] = time.monotonic()
                dst.write(chunk)
                await dst.drain()  # backpressure: at most a chunk or two per direction
                if left == 0:  # the body is through; a pipelined request stays unread
                    with contextlib.suppress(OSError):
                        if dst.can_write_eof():
                            dst.write_eof()
                    return

        ways = [
            asyncio.ensure_future(one_way(client_reader, upstream, client_bytes)),
            asyncio.ensure_future(one_way(upstream_reader, client)),
        ]
        try:
            pending = set(ways)
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=self.limits.idle_timeout, return_when=asyncio.FIRST_EXCEPTION
                )
                if any(not t.cancelled() and t.exception() is not None for t in done):
                    return
                if not done and time.monotonic() - last[0] >= self.limits.idle_timeout:
                    return
        finally:
            for task in ways:
                task.cancel()
            await asyncio.gather(*ways, return_exceptions=True)
