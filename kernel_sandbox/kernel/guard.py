"""A host-side relay that bounds the bytes one kernel connection can make the host hold.

Why: libzmq reads a multipart message whole into the receiving socket's queue before the
host can see any part of it.  ``ZMQ_MAXMSGSIZE`` bounds each *frame* and ``RCVHWM`` the
number of *complete* messages queued, but nothing bounds the frames of one message: a
sandbox sending one message of 40 frames of 8 MiB grew the host by 321 MiB, and more
frames grow it without limit.  Under tcp the kernel's sockets are CURVE servers, so the
end of a message is encrypted and cannot be seen on the way.

How: each host socket connects (ipc) to a listening socket of the :class:`FrameGuard`,
in a directory only this process can reach, and the guard connects to the kernel and
copies bytes both ways unchanged: the ZMTP session, CURVE included, stays between the
host socket and the kernel.  On the way from the kernel it reads the outer ZMTP framing
(frame sizes are visible under CURVE too) and charges each frame its bytes plus
``FRAME_COST``; the client reports the same charge for each message it receives
(:meth:`Route.delivered`).  Once the charge not yet received reaches the route's
``bound``, the guard stops reading from the kernel, which then waits or drops inside its
own limits.  When the host finds nothing to read while the guard is held there, what is
held is one incomplete message: the connection is cut, libzmq discards the partial
message, the route is marked closed and the client opens the channel again (its result
says output was lost).  A route held for ``GUARD_STALL_LIMIT`` seconds while the host reads
nothing at all is cut too.  Every end of a connection is seen here, so the client needs
no ZMQ socket monitor (``channels.py`` says why it must not use one).

One thread with one epoll set serves every route of the process; a connected route
holds two descriptors (three while it may still be reconnected), and at most ``GUARD_CHUNK_BYTES``
bytes in each direction.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import fcntl
import itertools
import logging
import os
import select
import shutil
import socket
import struct
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Sequence

from ..limits import GUARD_CHUNK_BYTES, GUARD_STALL_LIMIT
from .zmtp import Framing, FramingError, charge, socket_address

__all__ = ["FrameGuard", "Route", "frame_guard"]

log = logging.getLogger(__name__)

#: How long after the guard saw the host drain everything it was sent a look that finds
#: no message proves the held bytes are one incomplete message.
STALL_GRACE = 0.5
#: How often held routes are looked at (only while some route is held).
TICK = 0.05
#: Seconds between attempts to connect to a kernel that is not listening yet.
RETRY = 0.02

_IN, _OUT, _GONE = select.EPOLLIN, select.EPOLLOUT, select.EPOLLHUP | select.EPOLLERR
_PEERCRED = struct.Struct("3i")


class Route:
    """One host socket's path to the kernel through the guard.

    ``url`` is what the host socket connects to.  ``delivered`` and ``nothing_to_read``
    are called by the thread that reads the host socket; everything else runs in the
    guard's thread.
    """

    def __init__(self, guard: FrameGuard, target: str, bound: int, curve: bool) -> None:
        self.guard, self.target, self.bound, self.curve = guard, target, bound, curve
        self.path = os.path.join(guard.directory, str(next(guard.ids)))
        self.url = f"ipc://{self.path}"
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.setblocking(False)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.host: socket.socket | None = None
        self.kernel: socket.socket | None = None
        self.connecting = False
        self.framing = Framing(curve)
        self.relayed = 0  # charge read from the kernel (guard thread)
        self.bytes_in = 0  # bytes read from the kernel: moves while a message arrives
        self.bytes_out = 0  # bytes the host sent toward the kernel
        self.received = 0  # charge the host socket delivered (reader thread)
        self.to_host = memoryview(b"")
        self.to_kernel = memoryview(b"")
        self.held_since = 0.0  # when the bound was reached (0: not held)
        self.drained_at = 0.0  # when the host was seen to have read all it was sent
        self.looked_empty = 0.0  # when the reader last found no message
        self.last_delivery = time.monotonic()
        self.final = False  # kernel bytes reached the host: no second connection
        self.closed = False
        self.cuts = 0  # connections cut at the bound (for tests and logs)
        self._masks: dict[socket.socket, int] = {}

    @property
    def outstanding(self) -> int:
        """Charge read from the kernel that the host has not received as messages."""
        return self.relayed - self.received

    # -- called by the reader of the host socket ------------------------------------
    def delivered(self, frames: Sequence[bytes]) -> None:
        """The host socket delivered this message (every message must be reported)."""
        self.received += charge(frames)
        self.last_delivery = time.monotonic()
        if self.held_since:
            self.guard.call(self._update)

    def nothing_to_read(self) -> None:
        """The reader found no message; if the route is held, it may be starved."""
        if self.held_since:
            self.looked_empty = time.monotonic()
            self.guard.call(self._check_stall)

    def close(self) -> None:
        """Forget this route (its host socket is closed or replaced)."""
        self.guard.call(self._close)

    # -- guard thread ---------------------------------------------------------------
    def _listen(self) -> None:
        if self.listener is not None:
            self.guard.watch(self.listener, _IN, self._on_listener)

    def _on_listener(self, mask: int) -> None:
        if self.listener is None:  # a stale event: sealed or closed in the same batch
            return
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        pid, _uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if pid != os.getpid() or self.host is not None:
            conn.close()  # only this process's one socket goes through a route
            return
        conn.setblocking(False)
        self.host = conn
        self._connect()

    def _connect(self) -> None:
        """Connect to the kernel; while it is not listening yet, try again shortly.

        The host socket stays connected meanwhile (nothing is read from it yet), so
        it sees no drop: a dropped connection makes the client reopen the channel.
        """
        if self.closed or self.host is None or self.kernel is not None:
            return  # a stale retry: the route was closed, or connected meanwhile
        family, address = socket_address(self.target)
        self.kernel = socket.socket(family, socket.SOCK_STREAM)
        self.kernel.setblocking(False)
        if family == socket.AF_INET:
            self.kernel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = self.kernel.connect_ex(address)
        if err not in (0, errno.EINPROGRESS):
            self._retry()
            return
        self.connecting = err == errno.EINPROGRESS
        self._update()

    def _retry(self) -> None:
        """The kernel refused: connect again in ``RETRY`` seconds, if nothing was sent."""
        if self.bytes_in or self.bytes_out:  # a session began: the host must start over
            self._end()
            return
        if self.kernel is not None:
            self.guard.unregister(self.kernel)
            self._masks.pop(self.kernel, None)
            self.kernel.close()
            self.kernel = None
        self.connecting = False
        self.guard.later(RETRY, self._connect)

    def _on_kernel(self, mask: int) -> None:
        kernel, host = self.kernel, self.host
        if kernel is None or host is None:  # a stale event: ended in the same batch
            return
        if self.connecting:
            if kernel.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._retry()
                return
            self.connecting = False
            self._update()
            return
        if mask & _OUT and self.to_kernel:
            self.to_kernel = self.to_kernel[kernel.send(self.to_kernel) :]
            self._update()
        if mask & _IN and not self.to_host and self.relayed - self.received < self.bound:
            size = kernel.recv_into(self.guard.buffer)
            if not size:
                self._retry()  # an accepted connection closed before the greeting
                return
            data = self.guard.view[:size]
            self.bytes_in += size
            try:
                self.relayed += self.framing.feed(data)
            except FramingError as exc:
                log.warning("cut a kernel connection: %s", exc)
                self._close()
                return
            if not self.final:
                self._seal()
            try:
                sent = host.send(data)
            except BlockingIOError:
                sent = 0
            if sent < size:  # the rest waits in a copy: the buffer is the next read's
                self.to_host = memoryview(bytes(data[sent:]))
                self._update()
            elif self.relayed - self.received >= self.bound:
                self._update()
        elif mask & _GONE:
            self._end()  # hung up while the route was not reading it

    def _on_host(self, mask: int) -> None:
        kernel, host = self.kernel, self.host
        if kernel is None or host is None:  # a stale event: ended in the same batch
            return
        if mask & _OUT and self.to_host:
            self.to_host = self.to_host[host.send(self.to_host) :]
            self._update()
        if mask & _IN and not self.to_kernel:
            size = host.recv_into(self.guard.buffer)
            if not size:
                self._end()
                return
            data = self.guard.view[:size]
            self.bytes_out += size
            try:
                sent = kernel.send(data)
            except BlockingIOError:
                sent = 0
            if sent < size:
                self.to_kernel = memoryview(bytes(data[sent:]))
                self._update()
        elif mask & _GONE:
            self._end()

    def _seal(self) -> None:
        """The kernel answered: this route now serves this one connection only."""
        self.final = True
        if self.listener is not None:
            self.guard.unregister(self.listener)
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _update(self) -> None:
        """Set what the guard waits for on each socket, from the route's state."""
        if self.closed or self.host is None or self.kernel is None:
            return
        held = self.outstanding >= self.bound
        if held and not self.held_since:
            self.held_since = time.monotonic()
            self.drained_at = 0.0
            self.guard.held.add(self)
        elif not held and self.held_since:
            self.held_since = 0.0
            self.guard.held.discard(self)
        if self.connecting:
            kernel, host = _OUT, 0
        else:
            kernel = _OUT if self.to_kernel else 0
            if not self.to_host and not held:
                kernel |= _IN
            host = _OUT if self.to_host else 0
            if not self.to_kernel:
                host |= _IN
        for sock, mask, handler in (
            (self.kernel, kernel, self._on_kernel),
            (self.host, host, self._on_host),
        ):
            if self._masks.get(sock) != mask:
                self._masks[sock] = mask
                self.guard.watch(sock, mask, handler)

    def _check_stall(self) -> None:
        """Cut a held route whose host has read all it was sent and has no message."""
        if self.closed or not self.held_since or self.host is None:
            return
        now = time.monotonic()
        self._update()  # a delivery may have released it
        if not self.held_since:
            return
        if _unread(self.host):
            self.drained_at = 0.0
        elif not self.drained_at:
            self.drained_at = now
        starved = self.drained_at and self.looked_empty >= self.drained_at + STALL_GRACE
        if starved or now - max(self.held_since, self.last_delivery) >= GUARD_STALL_LIMIT:
            log.warning(
                "cut a kernel connection holding %d bytes of an unfinished message "
                "(the bound is %d)",
                self.outstanding,
                self.bound,
            )
            self.cuts += 1
            self._close()

    def _end(self) -> None:
        """One side hung up: a route that relayed nothing yet may be connected again."""
        if self.final:
            self._close()
            return
        for sock in (self.host, self.kernel):
            if sock is not None:
                self.guard.unregister(sock)
                sock.close()
        self.host = self.kernel = None
        self._masks.clear()
        self.connecting = False
        self.to_host = self.to_kernel = memoryview(b"")
        self.framing = Framing(self.curve)
        self.relayed = self.received = self.bytes_in = self.bytes_out = 0

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.guard.held.discard(self)
        for sock in (self.host, self.kernel, self.listener):
            if sock is not None:
                self.guard.unregister(sock)
                sock.close()
        self.host = self.kernel = self.listener = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _unread(sock: socket.socket) -> int:
    """Bytes sent on ``sock`` that its peer has not read yet (``SIOCOUTQ``)."""
    out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int.from_bytes(out, "little", signed=True)


class FrameGuard:
    """The relay thread and its epoll set, shared by every route of the process."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="kernel-sandbox-guard-")  # mode 0700
        self.ids = itertools.count()
        self.held: set[Route] = set()
        #: Every read lands here (the guard's thread only): a fresh 1 MiB ``bytes`` per
        #: ``recv`` cost ~35 µs of allocation each, most of what a small message paid.
        self.buffer = bytearray(GUARD_CHUNK_BYTES)
        self.view = memoryview(self.buffer)
        self._epoll = select.epoll()
        #: Descriptor to its socket and the route method that handles its events.
        self._handlers: dict[int, tuple[socket.socket, Callable[[int], None]]] = {}
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._timers: list[tuple[float, Callable[[], None]]] = []  # guard thread only
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._epoll.register(self._wake_r.fileno(), _IN)
        self._thread = threading.Thread(target=self._run, name="kernel-sandbox-guard", daemon=True)
        self._thread.start()
        atexit.register(shutil.rmtree, self.directory, True)

    def open(self, target: str, bound: int, curve: bool) -> Route:
        """A route to the kernel socket at ``target`` (a ZMQ URL) holding at most ``bound``.

        The listening socket exists when this returns, so the host socket can connect
        to ``route.url`` at once.
        """
        route = Route(self, target, bound, curve)
        self.call(route._listen)
        return route

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the guard's thread."""
        self._calls.append(fn)
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"\0")

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` in about ``delay`` seconds (from the guard's thread only)."""
        self._timers.append((time.monotonic() + delay, fn))

    def watch(self, sock: socket.socket, mask: int, handler: Callable[[int], None]) -> None:
        """Wait for ``mask`` events on ``sock`` (none: forget it); ``handler`` gets them."""
        fd = sock.fileno()
        known = self._handlers.get(fd)
        if known is not None and known[0] is not sock:  # a closed socket's number, reused
            self._forget(fd)
            known = None
        if not mask:
            self.unregister(sock)
            return
        self._handlers[fd] = (sock, handler)
        try:
            if known is None:
                self._epoll.register(fd, mask)
            else:
                self._epoll.modify(fd, mask)
        except FileExistsError:
            self._epoll.modify(fd, mask)
        except FileNotFoundError:
            self._epoll.register(fd, mask)

    def unregister(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        if fd >= 0:
            known = self._handlers.get(fd)
            if known is not None and known[0] is sock:
                self._forget(fd)
        else:  # closed already: drop whatever still names it
            for number, (other, _) in list(self._handlers.items()):
                if other is sock:
                    self._forget(number)

    def _forget(self, fd: int) -> None:
        del self._handlers[fd]
        with contextlib.suppress(OSError):
            self._epoll.unregister(fd)

    def _run(self) -> None:
        wake = self._wake_r.fileno()
        handlers = self._handlers
        while True:
            try:
                self._turn(wake, handlers)
            except Exception:  # the one thread of every route must never die
                log.exception("kernel connection guard: error in the relay loop")

    def _turn(
        self, wake: int, handlers: dict[int, tuple[socket.socket, Callable[[int], None]]]
    ) -> None:
        timeout = TICK if self.held else -1
        if self._timers:
            wait = min(at for at, _ in self._timers) - time.monotonic()
            timeout = max(0.0, min(wait, TICK))
        for fd, mask in self._epoll.poll(timeout):
            if fd == wake:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass
                continue
            known = handlers.get(fd)
            if known is not None and known[0].fileno() == fd:
                self._step(known[1], mask)
        if self._timers:
            now = time.monotonic()
            self._calls.extend(fn for at, fn in self._timers if at <= now)
            self._timers = [(at, fn) for at, fn in self._timers if at > now]
        while self._calls:
            fn = self._calls.popleft()
            try:
                fn()
            except Exception:
                log.exception("kernel connection guard: a call failed")
        for route in list(self.held):
            try:
                route._check_stall()
            except Exception:
                log.exception("kernel connection guard: closing a held route after an error")
                route._close()

    @staticmethod
    def _step(handler: Callable[[int], None], mask: int) -> None:
        route: Route = handler.__self__  # type: ignore[attr-defined]
        try:
            handler(mask)
        except (BlockingIOError, InterruptedError):
            route._update()
        except OSError:  # a reset or broken connection: as if it hung up
            route._end()
        except Exception:
            log.exception("kernel connection guard: closing a route after an error")
            route._close()


_GUARD: FrameGuard | None = None
_GUARD_LOCK = threading.Lock()
_GUARD_PID = 0


def frame_guard() -> FrameGuard:
    """The process's guard, started on first use (and again in a forked child)."""
    global _GUARD, _GUARD_PID
    with _GUARD_LOCK:
        if _GUARD is None or os.getpid() != _GUARD_PID:
            _GUARD, _GUARD_PID = FrameGuard(), os.getpid()
        return _GUARD
