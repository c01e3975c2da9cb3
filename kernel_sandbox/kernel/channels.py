"""The host's sockets to one kernel: bounded, pinned, guarded, read through the event loop.

Every socket a :class:`KernelSession` uses is made here: with the host's receive bounds
(``MAXMSGSIZE``, ``RCVHWM``), CURVE keys under tcp, ipc paths pinned to descriptors,
and a route through the process's connection guard (``guard.py``).  A connection that
ends (the guard cut it, ZMQ dropped it at an oversized frame, the kernel went away) is
seen on its route, and :meth:`KernelChannels.lost` names its channel so the session can
open the channel again.

The sockets are plain pyzmq sockets, read with ``NOBLOCK`` in the event loop's thread; a
wait for a message watches the socket's ``ZMQ_FD`` with ``loop.add_reader``
(:meth:`Channel.wait`).  That descriptor only says the socket's state *may* have
changed, and it is cleared by whatever makes libzmq process the socket's commands
(reading ``ZMQ_EVENTS``, a send, a receive), message queued or not.  So ``ZMQ_EVENTS`` is
asked before every wait (a message may be queued with the descriptor already cleared,
e.g. by a send on the same socket) and after every wake-up (the descriptor also wakes
for what is no message).  Messages are signed, built and parsed with jupyter_client's
``Session``.  Before, pyzmq's asyncio layer paid a poller, futures and enum conversions
for each wait, and jupyter_client's client a socket shadow per send and traitlets reads
per message: a quarter to a third of the host's CPU per call (``bench/RESULTS.md``, "The
host's client path").

No ZMQ socket monitor is used for the ends.  libzmq sends monitor events from its I/O
thread with a *blocking* send: once a monitor's reader is closed while its socket still
has the monitor on (or the reader's queue fills), that thread blocks for good and every
kernel connection of the process stalls (libzmq issue #3575).  A socket closed by the
client and its route closed right after raced exactly so: the guard's close reached the
socket's engine before ZMQ's reaper did, and the I/O thread reported the drop to a closed
reader (``bench/guard_stall.py`` shows it).  The guard sees the end of every connection
anyway: ZMQ closes its side after an oversized frame, and cuts and kernel ends are the
guard's.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import resource
import stat
from collections.abc import Callable
from typing import Any, cast

import zmq
from jupyter_client.session import Session

from ..errors import KernelError
from ..limits import HELD_MESSAGES, MAX_SOCKETS_CAP, RECEIVE_QUEUE
from ..threads import after_fork
from .connection import ConnectionInfo
from .guard import Route, frame_guard

__all__ = ["Channel", "KernelChannels", "open_socket", "shared_context"]

#: Off only to measure what the guard costs (bench/); never off in use: without the
#: guard, one message of many frames grows the host without bound, and a dropped
#: connection is not noticed (nothing watches it).
GUARD_CONNECTIONS = True
#: The channels a session opens (the stdin channel never is: calls refuse input, so
#: ``input_request`` messages have nowhere to pile up; heartbeats are not used).
CHANNELS = ("shell", "iopub", "control")
_SOCKET_TYPES = {"shell": zmq.DEALER, "iopub": zmq.SUB, "control": zmq.DEALER}

# pyzmq's constants as plain ints: its enum members are converted on every use.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)

_CONTEXT: zmq.Context[zmq.Socket[bytes]] | None = None


def shared_context() -> zmq.Context[zmq.Socket[bytes]]:
    """One ZMQ context (one IO thread) for every kernel connection of the process.

    Its sockets default to ``linger=0``: a message queued for a kernel that died must
    never make closing a socket, or garbage-collecting a context, block forever.  It may
    hold as many sockets as the process may open files (:func:`max_sockets`).
    """
    global _CONTEXT
    if _CONTEXT is None or _CONTEXT.closed:
        _CONTEXT = zmq.Context()
        _CONTEXT.set(zmq.MAX_SOCKETS, max_sockets())
        _CONTEXT.setsockopt(zmq.LINGER, 0)
    return _CONTEXT


def _forget_context() -> None:
    global _CONTEXT
    _CONTEXT = None  # a ZMQ context does not survive fork(): the child makes its own


after_fork(_forget_context)


def max_sockets() -> int:
    """The process's open-file limit, capped: the real bound on kernel connections.

    ZMQ's default of 1023 sockets per context stopped a process at 255 sandboxes (four
    sockets each then: ``ZMQError: Too many open files``) whatever its open-file limit;
    each socket also holds descriptors, so the open-file limit binds first anyway.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_SOCKETS_CAP
    return max(1023, min(soft, MAX_SOCKETS_CAP))


def open_socket(path: str) -> int:
    """A descriptor of the unix socket at ``path``; refuses links and other files."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        os.close(fd)
        kind = "a link" if os.path.islink(path) else "not a socket"
        raise KernelError(f"the kernel's socket {path} is {kind}; refusing to connect to it")
    return fd


def _bytes(value: str | bytes) -> bytes:
    """A key of the connection info as bytes (jupyter_client's own info has bytes)."""
    return value.encode() if isinstance(value, str) else value


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Channel:
    """One socket to the kernel and its route through the guard (``None``: unguarded).

    Used from one event loop's thread at a time; several tasks may wait on it at once.
    """

    __slots__ = (
        "_fd",
        "_loop",
        "_waiters",
        "closed",
        "dropped",
        "idle",
        "name",
        "route",
        "socket",
    )

    def __init__(self, name: str, sock: zmq.Socket[bytes], route: Route | None) -> None:
        self.name = name
        self.socket = sock
        self.route = route
        self.closed = False
        self._fd = cast(int, sock.get(zmq.FD))
        self._waiters: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Says nobody will read what this channel queues now (iopub between calls):
        #: what comes is dropped as it comes (:meth:`drop_queued`).  None: kept.
        self.idle: Callable[[], bool] | None = None
        #: Told how many messages :meth:`drop_queued` dropped, after it dropped some.
        self.dropped: Callable[[int], None] | None = None

    def readable(self) -> bool:
        """A message is queued (:meth:`receive` finds it); clears the socket's FD."""
        return not self.closed and bool(self.socket.get(_EVENTS) & _POLLIN)  # type: ignore[operator]

    def receive(self) -> list[bytes] | None:
        """The frames of the next queued message (reported to the route), or None.

        Frame by frame with ``copy=False``: ``recv_multipart`` asks ``RCVMORE`` through
        pyzmq's option enum for each frame, twice the cost of a small message.
        """
        try:
            frame = self.socket.recv(_NOBLOCK, copy=False)
        except zmq.Again:
            if self.route is not None:
                self.route.nothing_to_read()
            return None
        frames = [frame.bytes]
        while frame.more:  # the rest of a message is queued with its first frame
            frame = self.socket.recv(_NOBLOCK, copy=False)
            frames.append(frame.bytes)
        if self.route is not None:
            self.route.delivered(frames)
        return frames

    async def wait(self, timeout: float) -> bool:
        """True once a message is queued, False after ``timeout`` seconds without one.

        Called when :meth:`readable` said no.  The route is told when a wait ends with
        nothing (a held route may be starved).
        """
        if timeout > 0:
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                self._watch(loop)
            deadline = loop.time() + timeout
            while not self.closed:
                waiter: asyncio.Future[None] = loop.create_future()
                timer = loop.call_at(deadline, _wake, waiter)
                self._waiters.add(waiter)
                try:
                    await waiter
                finally:
                    timer.cancel()
                    self._waiters.discard(waiter)
                if self.readable():
                    return True
                if loop.time() >= deadline:
                    break
        if self.route is not None:
            self.route.nothing_to_read()
        return False

    def watch_idle(self) -> None:
        """Watch the socket from the running loop now, not only from a reader's first
        :meth:`wait`: what comes while nobody reads must be dropped as it comes
        (:attr:`idle`).  A client whose reads all found a message queued (a connect's
        probe) was never watched, so it dropped nothing; the kernel's ``XPUB_NODROP``
        sends then stalled every client's calls after ~90 of them (the unread backlog
        filled the socket's buffers) until one timed out."""
        loop = _running_loop()
        if loop is not None and self._loop is not loop and not self.closed:
            self._watch(loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the socket's FD from ``loop`` until the channel closes.

        Watched for good rather than for each wait: adding and removing a reader cost
        more than the rest of a wait (``bench/ab.py roundtrip``).  A loop used before is
        told to stop watching, in its own thread if it runs (a socket is never used from
        two threads; its watch is ignored there meanwhile, see :meth:`_on_fd`).
        """
        old, self._loop = self._loop, loop
        if old is not None:
            self._unwatch(old)
        loop.add_reader(self._fd, self._on_fd, loop)

    def _unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop.is_closed():
            return
        if loop.is_running() and loop is not _running_loop():
            loop.call_soon_threadsafe(self._drop, loop)
        else:
            loop.remove_reader(self._fd)

    def _drop(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:  # not watched from it again meanwhile
            loop.remove_reader(self._fd)

    def _on_fd(self, loop: asyncio.AbstractEventLoop) -> None:
        """The FD woke ``loop``: wake the waiters if a message is queued.

        Asking ``ZMQ_EVENTS`` also clears the FD when nobody waits (else the loop would
        be woken again and again), and spares the waiters a wake-up that the FD's
        event from the message they have just read brings: it comes after they ran.
        """
        if loop is not self._loop or not self.readable():
            return
        if self._waiters:
            for waiter in self._waiters:
                _wake(waiter)
        elif self.idle is not None and self.idle():
            self.drop_queued()

    def drop_queued(self, most: int = 64) -> None:
        """Receive and drop what is queued, at most ``most`` messages now (the rest on
        the loop's next turn, a flood never holding the loop).

        A kernel's iopub goes to every client connected to it, and the kernel waits for
        the slowest (``XPUB_NODROP``: back-pressure, nothing lost): a client that queued
        its share unread, such as another worker's copy of the sandbox between its calls,
        stalled every other client's calls until they timed out.  :attr:`dropped` is
        told how many were dropped (it may close the channel).
        """
        count = 0
        try:
            for _ in range(most):
                if self.closed or self.receive() is None:
                    return
                count += 1
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon(self._on_fd, loop)
        finally:
            if count and self.dropped is not None:
                self.dropped(count)

    def send(self, frames: list[bytes]) -> None:
        """Send one message's frames (blocks only while ZMQ's send queue is full)."""
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            self.socket.send(frame, _SNDMORE if i < last else 0)

    def close(self) -> None:
        """Close the socket and forget its route; tasks waiting on it wake up."""
        if self.closed:
            return
        self.closed = True
        for waiter in list(self._waiters):
            _wake(waiter)
        if self._loop is not None:  # before the socket's descriptor can be reused
            loop, self._loop = self._loop, None
            self._unwatch(loop)
        self.socket.close(linger=0)
        if self.route is not None:
            self.route.close()


class KernelChannels:
    """The host's channels to one kernel, made bounded, pinned and guarded.

    Pinned: the ipc sockets live in a directory the sandbox can write to, so code inside
    could replace one by a link to any unix socket on the host; ZMQ reconnects by path
    and would follow it.  Each socket is opened once with ``O_PATH | O_NOFOLLOW``,
    checked to be a socket, and reached only as ``/proc/self/fd/N`` (``pinned``): every
    (re)connect goes to that same inode, whatever the path holds later.
    """

    def __init__(self, info: ConnectionInfo, max_message_bytes: int) -> None:
        self.info = info
        self.max_message_bytes = max_message_bytes
        #: Signs, builds and parses the messages (jupyter_client's, with the kernel's key).
        self.session = Session(key=_bytes(info["key"]), signature_scheme=info["signature_scheme"])
        # The session's traits read once: each read of a trait costs ~0.5 µs, and
        # ``Session.sign`` reads two per message (4.6 µs a signature, 2.5 µs this way).
        self._auth, self._unpack = self.session.auth, self.session.unpack
        #: Channel name ("shell", "iopub", ...) to the URL it connects to instead.
        self.pinned: dict[str, str] = {}
        #: The open channels by name.
        self.open: dict[str, Channel] = {}
        #: Given to every iopub channel as its :attr:`Channel.idle`.
        self.iopub_idle: Callable[[], bool] | None = None
        #: Given to every iopub channel as its :attr:`Channel.dropped`.
        self.iopub_dropped: Callable[[int], None] | None = None
        public, secret = info.get("curve_publickey"), info.get("curve_secretkey")
        self._curve = (_bytes(public), _bytes(secret)) if public and secret else None

    def url(self, name: str) -> str:
        """Where channel ``name`` connects (jupyter_client's URLs, unless pinned)."""
        if name in self.pinned:
            return self.pinned[name]
        ip, port = self.info["ip"], self.info[f"{name}_port"]  # type: ignore[literal-required]
        if self.info["transport"] == "tcp":
            return f"tcp://{ip}:{port}"
        return f"{self.info['transport']}://{ip}-{port}"

    def start(self) -> None:
        """Open every channel of :data:`CHANNELS`."""
        for name in CHANNELS:
            self.connect(name)

    def connect(self, name: str) -> Channel:
        """A new socket for channel ``name``, with the host's receive bounds, connected.

        ``MAXMSGSIZE`` makes ZMQ drop the connection instead of reading a frame over
        ``max_message_bytes``; ``RCVHWM`` caps the messages queued on the host side, so
        output the host does not read waits, or is dropped, in the container.  Both only
        apply to connections made after they are set.  The socket reaches the kernel
        through a route of the guard, which holds back what the host has not received
        past ``HELD_MESSAGES`` messages' worth of bytes and tells when the connection
        ends (:meth:`lost`).  Any channel open under that name is closed first.
        """
        self.close_channel(name)
        sock = shared_context().socket(_SOCKET_TYPES[name])
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE.get(name, 2))
        if name == "iopub":
            sock.setsockopt(zmq.SUBSCRIBE, b"")
        else:  # as jupyter_client's: the kernel's ROUTER sees the session's id
            sock.identity = self.session.bsession
        if self._curve is not None:  # tcp: the kernel's sockets are CURVE servers
            public, secret = self._curve
            sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = (
                secret,
                public,
                public,
            )
        url, route = self.url(name), None
        if GUARD_CONNECTIONS:
            route = frame_guard().open(
                url, HELD_MESSAGES * self.max_message_bytes, curve=self._curve is not None
            )
            url = route.url
        sock.connect(url)
        channel = self.open[name] = Channel(name, sock, route)
        if name == "iopub":
            channel.idle, channel.dropped = self.iopub_idle, self.iopub_dropped
        return channel

    def request(self, name: str, msg_type: str, content: dict[str, Any] | None = None) -> str:
        """Send a ``msg_type`` request with ``content`` on channel ``name``; its msg_id."""
        msg = self.session.msg(msg_type, content)
        self.open[name].send(self.session.serialize(msg))
        return str(msg["header"]["msg_id"])

    def parse(self, frames: list[bytes]) -> dict[str, Any] | None:
        """The message in ``frames``, or None if its signature is not the session's.

        As ``Session.deserialize`` does, except that headers are not searched for ISO
        dates to parse with dateutil (nothing here reads them).
        """
        frames = cast(list[bytes], self.session.feed_identities(frames)[1])
        signature, *parts = frames[:5]
        if self._auth is not None:
            digest = self._auth.copy()
            for part in parts:
                digest.update(part)
            if not hmac.compare_digest(signature, digest.hexdigest().encode()):
                return None
        unpack = self._unpack
        header = unpack(parts[0])
        return {
            "header": header,
            "parent_header": unpack(parts[1]),
            "metadata": unpack(parts[2]),
            "content": unpack(parts[3]),
            "msg_id": header.get("msg_id"),
            "msg_type": header.get("msg_type"),
            "buffers": frames[5:],
        }

    def route(self, name: str) -> Route | None:
        """Channel ``name``'s route through the guard (None: not open, or unguarded)."""
        channel = self.open.get(name)
        return channel.route if channel is not None else None

    def lost(self) -> set[str]:
        """Channels whose connection ended (cut, dropped by ZMQ, or the kernel's end)."""
        return {n for n, c in self.open.items() if c.route is not None and c.route.closed}

    def held(self) -> set[str]:
        """Channels whose route holds the kernel back at its bound right now."""
        return {n for n, c in self.open.items() if c.route is not None and c.route.held_since}

    def close_channel(self, name: str) -> None:
        """Close channel ``name`` if it is open."""
        channel = self.open.pop(name, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        """Close every channel (and forget its route)."""
        for name in list(self.open):
            self.close_channel(name)
