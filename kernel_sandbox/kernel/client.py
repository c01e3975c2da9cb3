"""One live connection to a kernel: readiness, execute, interrupt.

Built on jupyter_client's ``AsyncKernelClient``.  The kernel lives in a container the
session knows nothing about; the caller passes ``check_alive`` so that a silent kernel
can be told apart from a dead one without this layer knowing about Docker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import time
from queue import Empty
from typing import Any

import zmq

from ..errors import KernelError
from ..limits import DEFAULT_MAX_OUTPUT_BYTES, MESSAGE_OVERHEAD, REPLY_TEXT_CHARS
from .channels import GuardedClient, open_socket, shared_context
from .connection import PORT_NAMES, ConnectionInfo
from .execution import AliveCheck, Call, OutputCallback, RawExecution
from .guard import Route

__all__ = ["AliveCheck", "KernelSession", "OutputCallback", "RawExecution"]

log = logging.getLogger(__name__)

# pyzmq's constants as plain ints: its enum members are converted on every use.
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)

#: How often a starting kernel's container is asked about (an engine call) while waiting.
STARTUP_ALIVE_INTERVAL = 0.2


#: The client's private channel slots (``None`` until a channel is made).
_CHANNEL_ATTRS = (
    "_shell_channel",
    "_iopub_channel",
    "_stdin_channel",
    "_hb_channel",
    "_control_channel",
)


def _readable(sock: zmq.Socket[bytes]) -> bool:
    """A message is queued on ``sock`` (read with ``NOBLOCK``, it does not raise)."""
    return bool(sock.get(_EVENTS) & _POLLIN)  # type: ignore[operator]


class KernelSession:
    """A jupyter_client connection to one running kernel.

    Every byte the kernel sends is bounded here: a message is at most
    ``max_output_bytes + MESSAGE_OVERHEAD`` bytes and each channel queues at most
    ``channels.RECEIVE_QUEUE`` of them; the stdin channel is never opened (calls run with
    ``allow_stdin=False``), so ``input_request`` messages have nowhere to pile up.
    """

    def __init__(
        self, info: ConnectionInfo, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> None:
        self.info = info
        self.client = GuardedClient(max_output_bytes + MESSAGE_OVERHEAD, context=shared_context())
        self.client.load_connection_info(dict(info))  # type: ignore[arg-type]
        self._readers: dict[int, tuple[zmq.Socket[bytes], Route | None]] = {}
        self._alive_checked = 0.0
        self._fds: list[int] = []
        #: iopub was reopened since the last call began (ZMQ subscribes asynchronously).
        self._resubscribe_needed = False
        #: The content of the kernel's kernel_info_reply at connect (its ``language_info``,
        #: ``implementation``...): what the kernel says, so bound it before keeping it.
        self.kernel_info: dict[str, Any] = {}

    async def connect(self, timeout: float, check_alive: AliveCheck) -> None:
        """Open the channels and wait until the kernel answers on shell *and* iopub."""
        deadline = time.monotonic() + timeout
        # The first "is it still alive?" engine call comes after an interval, not at once:
        # the container was started just now, and on a busy engine the call competes
        # with the kernel's start.
        self._alive_checked = time.monotonic()
        if self.info["transport"] == "ipc":
            paths = [f"{self.info['ip']}-{self.info[p]}" for p in PORT_NAMES]  # type: ignore[literal-required]
            while not all(os.path.lexists(p) for p in paths):
                await self._wait_or_fail(deadline, check_alive, 0.01)
            self._fds = [open_socket(p) for p in paths]
            self.client.pinned = {
                name.removesuffix("_port"): f"ipc:///proc/self/fd/{fd}"
                for name, fd in zip(PORT_NAMES, self._fds, strict=True)
            }
        self.client.start_channels(hb=False, stdin=False)
        # One probe at a time; ZMQ queues it until the kernel's socket is bound.  The
        # reply proves shell works; a status message proves iopub is subscribed (the
        # status of the very first probe may be published before we subscribe).
        iopub_ready = False
        while not iopub_ready:
            msg_id = self.client.kernel_info()
            while True:
                try:
                    reply = await self._get_msg(self.client.shell_channel, 0.05)
                except Empty:
                    await self._wait_or_fail(deadline, check_alive, 0)
                    continue
                if reply is not None and reply["parent_header"].get("msg_id") == msg_id:
                    content = reply.get("content")
                    self.kernel_info = content if isinstance(content, dict) else {}
                    break
            try:
                iopub_ready = await self._get_msg(self.client.iopub_channel, 0.1) is not None
            except Empty:
                await self._wait_or_fail(deadline, check_alive, 0)
        while True:  # drop the remaining status messages of the probes
            try:
                await self._get_msg(self.client.iopub_channel, 0.01)
            except Empty:
                break

    async def _wait_or_fail(self, deadline: float, check_alive: AliveCheck, pause: float) -> None:
        now = time.monotonic()
        if now > deadline:
            raise KernelError("the kernel did not answer in time")
        # Asked every 10 ms, the engine competed for the CPU with the starting kernel.
        if now - self._alive_checked >= STARTUP_ALIVE_INTERVAL:
            self._alive_checked = now
            reason = await check_alive()
            if reason:
                raise KernelError(f"the kernel exited while starting: {reason}")
        if pause:
            await asyncio.sleep(pause)

    async def ping(self, timeout: float) -> bool:
        """True if the kernel answers a ``kernel_info_request`` within ``timeout`` seconds.

        A cheap readiness check (one shell round trip, no engine call) for a kernel that
        should be idle, e.g. before a pool hands it out.
        """
        msg_id = self.client.kernel_info()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                reply = await self._get_msg(self.client.shell_channel, left)
            except Empty:
                return False
            if reply is not None and reply["parent_header"].get("msg_id") == msg_id:
                return True
        return False

    async def warm_up(self) -> None:
        """Run one silent cell so that a first real call skips first-time code paths.

        Takes ~3 ms off the next call (bench/); silent and without history, it leaves
        no execution count, no ``In``/``Out`` entry and no output.
        """
        msg_id = self.client.execute(
            "print(end='')", silent=True, store_history=False, allow_stdin=False
        )
        await self._reply({msg_id})

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code (control channel)."""
        msg = self.client.session.msg("interrupt_request", content={})
        self.client.control_channel.send(msg)

    async def execute(
        self,
        code: str,
        *,
        timeout: float,
        interrupt_grace: float,
        check_alive: AliveCheck,
        on_output: OutputCallback | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        store_history: bool = True,
    ) -> RawExecution:
        """Run ``code``; collect its outputs until the kernel goes idle for this request.

        At ``timeout`` the kernel is interrupted; if it is silent but still busy
        ``interrupt_grace`` seconds later, or still sending ``DRAIN_LIMIT`` seconds
        after that, the outcome is ``stuck`` and the caller should restart it.  The
        deadline is checked before every message, not only when iopub is silent: a
        cell that prints without pause must be interrupted too.  At most
        ``max_output_bytes`` of output is kept (see :class:`OutputCollector`), and
        ``on_output`` sees nothing after the interrupt (the result has it all).
        ``store_history=False`` leaves the kernel's history and execution count alone
        (the machinery's own code, e.g. a snapshot's).  The request in flight is a
        :class:`~kernel_sandbox.kernel.execution.Call` (its module draws the states).
        """
        # What a route holds back now is from before this call (output of threads, a
        # message too big to finish): the channel starts afresh instead of behind it.
        self._relink(self.client.held())
        if self._resubscribe_needed:  # iopub was reopened: wait until it is subscribed
            await self._resubscribe()
            self._resubscribe_needed = False
        msg_id = self.client.execute(code, store_history=store_history, allow_stdin=False)
        call = Call(
            self,
            msg_id,
            timeout=timeout,
            interrupt_grace=interrupt_grace,
            check_alive=check_alive,
            on_output=on_output,
            max_output_bytes=max_output_bytes,
        )
        return await call.run()

    def _iopub_moved(self) -> int:
        """Bytes the guard has relayed on iopub: a message being received moves it."""
        route = self.client.routes.get("iopub")
        return route.bytes_in if route is not None else 0

    def _relink(self, also: set[str] | None = None) -> set[str]:
        """Open again the channels whose connection ended (and ``also``); their names.

        ZMQ drops a connection when the kernel sends a frame over the per-message limit,
        and the guard cuts one that holds an unfinished message over its bound; what was
        in flight on it is lost.  Either way the channel's route is closed
        (``channels.py`` says why no ZMQ monitor is asked).
        """
        lost = self.client.lost() | (also or set())
        self._resubscribe_needed |= "iopub" in lost
        for name in lost:
            log.warning("the kernel's %s connection was dropped; reopening it", name)
            channel = getattr(self.client, f"_{name}_channel")
            if channel is not None:
                self._readers.pop(id(channel.socket), None)
            self.client.reopen(name)
        return lost

    async def _resubscribe(self, timeout: float = 5) -> None:
        """Wait until a new iopub socket receives (ZMQ subscribes asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = self.client.kernel_info()
            with contextlib.suppress(Empty):
                while True:
                    msg = await self._get_msg(self.client.iopub_channel, 0.2)
                    if msg is not None and msg["parent_header"].get("msg_id") == probe:
                        return

    async def _reply(self, msg_ids: set[str], wait: float = 5) -> dict[str, Any] | None:
        """The reply to one of ``msg_ids`` within ``wait`` seconds, its texts capped.

        Other replies on shell (of calls given up on, probes) are dropped on the way;
        past ``wait``, only those already queued (at most ``channels.RECEIVE_QUEUE`` and the few
        the kernel has sent since) are read.
        """
        deadline = time.monotonic() + wait
        for skipped in itertools.count():
            left = deadline - time.monotonic()
            try:
                msg = await self._get_msg(self.client.shell_channel, max(0.0, left))
            except Empty:
                return None
            if msg is not None and msg["parent_header"].get("msg_id") in msg_ids:
                content = msg["content"]
                return {
                    "status": content.get("status"),
                    "execution_count": content.get("execution_count"),
                    "ename": str(content.get("ename", "Error"))[:REPLY_TEXT_CHARS],
                    "evalue": str(content.get("evalue", ""))[:REPLY_TEXT_CHARS],
                }
            if left <= 0 and skipped > 100:  # a kernel that floods shell
                return None
        raise AssertionError("unreachable")

    async def _get_msg(self, channel: Any, timeout: float) -> dict[str, Any] | None:
        """``channel.get_msg`` made cheaper for the per-call path.

        Kept hand-written for speed: ``bench/handwritten.py --n 2000`` (a local kernel
        answering ``kernel_info_request``, both readers taking turns) measured a median
        round trip of 0.82 ms with ``get_msg`` and 0.77 ms with this, so about 50 µs a
        message; a ``print(1+1)`` call reads five.

        A message that is already queued is read at once, without a future and an
        event-loop turn (asked with ``EVENTS``, as plain ints: a ``zmq.Again`` raised,
        or pyzmq's enum flags converted, cost several µs each, several times a call);
        headers are not searched for ISO dates to parse with dateutil
        (nothing here reads them).  Raises ``Empty`` after ``timeout`` seconds; returns
        None for a message with a bad signature (dropped, as a forged one would be).
        Every message read from the kernel goes through here: its size is reported to
        the socket's guard route, and so is finding nothing.
        """
        key = id(channel.socket)
        reader, route = self._readers.get(key) or (None, None)
        if reader is None:
            reader = zmq.Socket.shadow(channel.socket.underlying)
            route = self.client.socket_routes.get(key)
            self._readers[key] = reader, route
        if _readable(reader):
            frames = reader.recv_multipart(_NOBLOCK)
        else:
            if not await channel.socket.poll(timeout * 1000):
                if route is not None:
                    route.nothing_to_read()
                raise Empty
            try:
                frames = reader.recv_multipart(_NOBLOCK)
            except zmq.Again:  # woken without a message: the caller asks again
                if route is not None:
                    route.nothing_to_read()
                return None
        if route is not None:
            route.delivered(frames)
        session = self.client.session
        _, frames = session.feed_identities(frames)
        signature, *parts = frames[:5]
        if session.auth is not None and not hmac.compare_digest(signature, session.sign(parts)):
            log.warning("dropped a message with an invalid signature from the kernel")
            return None
        header, parent, metadata, content = (session.unpack(p) for p in parts)
        return {
            "header": header,
            "parent_header": parent,
            "metadata": metadata,
            "content": content,
            "msg_id": header.get("msg_id"),
            "msg_type": header.get("msg_type"),
            "buffers": frames[5:],
        }

    def close(self) -> None:
        """Close the channels and the ZMQ context's sockets of this client."""
        self._readers.clear()  # shadows only: the channels own the sockets
        # Not ``stop_channels()``: its ``shell_channel`` & co. are properties that *create*
        # (and connect) every channel not made yet, with path URLs a sandbox may have
        # replaced by links to any socket on the host.  Only what exists is closed.
        for attr in _CHANNEL_ATTRS:
            channel = getattr(self.client, attr, None)
            if channel is None:
                continue
            try:
                if channel.is_alive():
                    channel.stop()
                else:
                    channel.close()
            except Exception:  # closing a half-open client must never hide the real error
                log.debug("error while closing kernel channel %s", attr, exc_info=True)
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.client.close_routes()
