"""The host's sockets to one kernel: made bounded, pinned, guarded, and made again.

Every socket a :class:`KernelSession` uses is made here: with the host's receive bounds
(``MAXMSGSIZE``, ``RCVHWM``), CURVE keys under tcp, ipc paths pinned to descriptors,
and a route through the process's connection guard (``guard.py``).  A connection that
ends (the guard cut it, ZMQ dropped it at an oversized frame, the kernel went away) is
seen on its route, and :meth:`GuardedClient.lost` names its channel so the session can
open the channel again.

No ZMQ socket monitor is used for that.  libzmq sends monitor events from its I/O thread
with a *blocking* send: once a monitor's reader is closed while its socket still has the
monitor on (or the reader's queue fills), that thread blocks for good and every kernel
connection of the process stalls (libzmq issue #3575).  A socket closed by the client
and its route closed right after raced exactly so: the guard's close reached the socket's
engine before ZMQ's reaper did, and the I/O thread reported the drop to a closed reader
(``bench/guard_stall.py`` shows it).  The guard sees the end of every connection anyway:
ZMQ closes its side after an oversized frame, and cuts and kernel ends are the guard's.
"""

from __future__ import annotations

import os
import resource
import stat
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import channel_socket_types

from ..errors import KernelError
from ..limits import HELD_MESSAGES, MAX_SOCKETS_CAP, RECEIVE_QUEUE
from ..threads import after_fork
from .guard import Route, frame_guard

__all__ = ["GuardedClient", "open_socket", "shared_context"]

#: Off only to measure what the guard costs (bench/); never off in use: without the
#: guard, one message of many frames grows the host without bound, and a dropped
#: connection is not noticed (nothing watches it).
GUARD_CONNECTIONS = True

_CONTEXT: zmq.asyncio.Context | None = None


def shared_context() -> zmq.asyncio.Context:
    """One ZMQ context (one IO thread) for every kernel connection of the process.

    Its sockets default to ``linger=0``: a message queued for a kernel that died must
    never make closing a socket, or garbage-collecting a context, block forever.  It may
    hold as many sockets as the process may open files (:func:`max_sockets`).
    """
    global _CONTEXT
    if _CONTEXT is None or _CONTEXT.closed:
        _CONTEXT = zmq.asyncio.Context()
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


class GuardedClient(AsyncKernelClient):
    """A jupyter_client client whose sockets are bounded, pinned and guarded.

    Pinned: the ipc sockets live in a directory the sandbox can write to, so code inside
    could replace one by a link to any unix socket on the host; ZMQ reconnects by path
    and would follow it.  Each socket is opened once with ``O_PATH | O_NOFOLLOW``,
    checked to be a socket, and reached only as ``/proc/self/fd/N`` (``pinned``): every
    (re)connect goes to that same inode, whatever the path holds later.
    """

    def __init__(self, max_message_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Channel name ("shell", "iopub", ...) to the URL it connects to instead.
        self.pinned: dict[str, str] = {}
        self.max_message_bytes = max_message_bytes
        #: Channel name to its route through the guard; socket id to the same route.
        self.routes: dict[str, Route] = {}
        self.socket_routes: dict[int, Route] = {}

    def _make_url(self, channel: str) -> str:
        return self.pinned.get(channel) or super()._make_url(channel)

    def _create_connected_socket(
        self, channel: str, identity: bytes | None = None
    ) -> zmq.asyncio.Socket:
        """jupyter_client's socket, with the host's receive bounds set before it connects.

        ``MAXMSGSIZE`` makes ZMQ drop the connection instead of reading a frame over
        ``max_message_bytes``; ``RCVHWM`` caps the messages queued on the host side, so
        output the host does not read waits, or is dropped, in the container.  Both only
        apply to connections made after they are set.  The socket reaches the kernel
        through a route of the guard, which holds back what the host has not received
        past ``HELD_MESSAGES`` messages' worth of bytes and tells when the connection
        ends (:meth:`lost`).
        """
        sock: zmq.asyncio.Socket = self.context.socket(channel_socket_types[channel])
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE.get(channel, 2))
        if identity:
            sock.identity = identity
        if self.curve_publickey is not None:  # tcp: the kernel's sockets are CURVE servers
            sock.curve_secretkey = self.curve_secretkey
            sock.curve_publickey = self.curve_publickey
            sock.curve_serverkey = self.curve_publickey
        url = self._make_url(channel)
        self._forget_route(channel)
        if GUARD_CONNECTIONS:
            route = frame_guard().open(
                url, HELD_MESSAGES * self.max_message_bytes, curve=self.curve_publickey is not None
            )
            self.routes[channel] = self.socket_routes[id(sock)] = route
            url = route.url
        sock.connect(url)
        return sock

    def _forget_route(self, channel: str) -> None:
        route = self.routes.pop(channel, None)
        if route is not None:
            route.close()
            self.socket_routes = {k: r for k, r in self.socket_routes.items() if r is not route}

    def lost(self) -> set[str]:
        """Channels whose connection ended (cut, dropped by ZMQ, or the kernel's end)."""
        return {name for name, route in self.routes.items() if route.closed}

    def held(self) -> set[str]:
        """Channels whose route holds the kernel back at its bound right now."""
        return {name for name, route in self.routes.items() if route.held_since}

    def reopen(self, name: str) -> None:
        """Close channel ``name`` and connect a new socket (through a new route)."""
        channel = getattr(self, f"_{name}_channel")
        if channel is None:
            return
        channel.close()
        setattr(self, f"_{name}_channel", None)
        getattr(self, f"{name}_channel")  # jupyter_client's property connects a new one

    def close_routes(self) -> None:
        """Forget every route (the sockets are closed by the caller)."""
        for name in list(self.routes):
            self._forget_route(name)
        self.socket_routes.clear()
