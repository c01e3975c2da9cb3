"""One live connection to a kernel: readiness, execute, interrupt.

Built on :class:`~kernel_sandbox.kernel.channels.KernelChannels` (raw pyzmq sockets read
through the event loop, messages by jupyter_client's ``Session``).  The kernel lives in a
container the session knows nothing about; the caller passes ``check_alive`` so that a
silent kernel can be told apart from a dead one without this layer knowing about Docker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator
from queue import Empty
from typing import Any

from ..errors import KernelError
from ..limits import DEFAULT_MAX_OUTPUT_BYTES, MESSAGE_OVERHEAD, REPLY_TEXT_CHARS
from .channels import KernelChannels, open_socket
from .connection import PORT_NAMES, ConnectionInfo
from .execution import AliveCheck, Call, OutputCallback, RawExecution

__all__ = ["AliveCheck", "KernelSession", "OutputCallback", "RawExecution"]

log = logging.getLogger(__name__)


def _idle_after(msg: dict[str, Any] | None, msg_id: str) -> bool:
    """True if ``msg`` is the idle status that ends request ``msg_id``."""
    if msg is None or msg.get("msg_type") != "status":
        return False
    parent, content = msg.get("parent_header"), msg.get("content")
    return (
        isinstance(parent, dict)
        and isinstance(content, dict)
        and parent.get("msg_id") == msg_id
        and content.get("execution_state") == "idle"
    )


#: How often a starting kernel's container is asked about (an engine call) while waiting.
STARTUP_ALIVE_INTERVAL = 0.2
#: iopub messages of other clients' calls (~4 each) that a client between its own calls
#: drops before it unsubscribes until its next call (:meth:`KernelSession._park_iopub`).
IOPUB_PARK_AFTER = 32


class KernelSession:
    """A Jupyter protocol connection to one running kernel.

    Every byte the kernel sends is bounded here: a message is at most
    ``max_output_bytes + MESSAGE_OVERHEAD`` bytes and each channel queues at most
    ``channels.RECEIVE_QUEUE`` of them; the stdin channel is never opened (calls run with
    ``allow_stdin=False``), so ``input_request`` messages have nowhere to pile up.
    """

    def __init__(
        self, info: ConnectionInfo, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> None:
        self.info = info
        self.channels = KernelChannels(info, max_output_bytes + MESSAGE_OVERHEAD)
        #: Readers of iopub now (a call, the connect); with none, what iopub gets is
        #: dropped as it comes (``Channel.drop_queued``: other clients' output).
        self._reading = 0
        self.channels.iopub_idle = lambda: self._reading == 0
        self.channels.iopub_dropped = self._dropped_idle
        #: iopub messages dropped since the last reader began (other clients' output).
        self._dropped = 0
        #: iopub is closed until the next call (:meth:`_park_iopub`).
        self._parked = False
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
            self.channels.pinned = {
                name.removesuffix("_port"): f"ipc:///proc/self/fd/{fd}"
                for name, fd in zip(PORT_NAMES, self._fds, strict=True)
            }
        self.channels.start()
        with self._reading_iopub():
            await self._probe(deadline, check_alive)

    async def _probe(self, deadline: float, check_alive: AliveCheck) -> None:
        """Until the kernel answers a probe on shell and publishes on iopub."""
        # One probe at a time; ZMQ queues it until the kernel's socket is bound.  The
        # reply proves shell works; a status message proves iopub is subscribed (the
        # status of the very first probe may be published before we subscribe).
        iopub_ready = idle = False
        while not iopub_ready:
            msg_id = self._request("kernel_info_request")
            while True:
                try:
                    reply = await self._get_msg("shell", 0.05)
                except Empty:
                    await self._wait_or_fail(deadline, check_alive, 0)
                    continue
                if reply is not None and reply["parent_header"].get("msg_id") == msg_id:
                    content = reply.get("content")
                    self.kernel_info = content if isinstance(content, dict) else {}
                    break
            try:
                msg = await self._get_msg("iopub", 0.1)
            except Empty:
                await self._wait_or_fail(deadline, check_alive, 0)
            else:
                iopub_ready, idle = msg is not None, _idle_after(msg, msg_id)
        # Drop the remaining status messages of the probes: up to the last probe's idle,
        # which ends them (the kernel answers shell requests in order), or else until
        # iopub is quiet for 10 ms (that idle was published before the subscription took).
        # Waiting for the quiet alone added its 10 ms to every start.
        while not idle:
            try:
                idle = _idle_after(await self._get_msg("iopub", 0.01), msg_id)
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
        msg_id = self._request("kernel_info_request")
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                reply = await self._get_msg("shell", left)
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
        msg_id = self._execute_request("print(end='')", silent=True, store_history=False)
        await self._reply({msg_id})

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code (control channel)."""
        self._request("interrupt_request", channel="control")

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
        self._relink(self.channels.held())
        if self._parked:  # subscribe again (waited for below, as after a reconnect)
            self._parked = False
            self.channels.connect("iopub")
            self._resubscribe_needed = True
        with self._reading_iopub():
            if self._resubscribe_needed:  # iopub was reopened: wait until it is subscribed
                await self._resubscribe()
                self._resubscribe_needed = False
            msg_id = self._execute_request(code, store_history=store_history)
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

    @contextlib.contextmanager
    def _reading_iopub(self) -> Iterator[None]:
        """iopub is read in this block: kept meanwhile; after the last reader, what is
        queued (output of other clients, of threads) is dropped, and so is what comes
        until the next reader (``Channel.idle``): a kernel waits for its slowest
        client's iopub, so an idle one must not hold its share."""
        self._reading += 1
        self._dropped = 0
        try:
            yield
        finally:
            self._reading -= 1
            iopub = self.channels.open.get("iopub")
            if not self._reading and iopub is not None:
                iopub.watch_idle()
                iopub.drop_queued()

    def _dropped_idle(self, count: int) -> None:
        """``count`` iopub messages were dropped (no call of ours reads them)."""
        self._dropped += count
        if not self._reading and self._dropped >= IOPUB_PARK_AFTER:
            self._park_iopub()

    def _park_iopub(self) -> None:
        """Close iopub until this client's next call, which subscribes again.

        The kernel publishes every client's output to every subscriber, so a client
        that does not call (another server worker's or replica's cached copy of a
        sandbox whose calls go elsewhere) received, relayed through the guard and
        dropped the output of every other client's call: ~0.6 ms of the server's CPU
        per call per idle copy (bench/replicas.py).  Closed, the kernel sends it
        nothing.  Only after :data:`IOPUB_PARK_AFTER` messages of others' calls: a
        lone client keeps its subscription, and one whose calls alternate with
        another's rarely pays the next call's wait for the new subscription (one
        ``kernel_info`` round trip, :meth:`_resubscribe`)."""
        self._parked = True
        self.channels.close_channel("iopub")

    @property
    def max_message_bytes(self) -> int:
        """The most bytes one message from the kernel may have (``ZMQ_MAXMSGSIZE``)."""
        return self.channels.max_message_bytes

    def _request(self, msg_type: str, channel: str = "shell") -> str:
        """Send a request without content (``kernel_info_request``...); its msg_id."""
        return self.channels.request(channel, msg_type, {})

    def _execute_request(self, code: str, *, store_history: bool, silent: bool = False) -> str:
        """Send an ``execute_request`` as jupyter_client's ``execute`` builds it; its msg_id.

        ``allow_stdin`` is always off: the stdin channel is never opened.
        """
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        return self.channels.request("shell", "execute_request", content)

    def _iopub_moved(self) -> int:
        """Bytes the guard has relayed on iopub: a message being received moves it."""
        route = self.channels.route("iopub")
        return route.bytes_in if route is not None else 0

    def _iopub_held(self) -> bool:
        """iopub's route holds the kernel back at its bound (output unread past it)."""
        route = self.channels.route("iopub")
        return route is not None and bool(route.held_since)

    def _relink(self, also: set[str] | None = None) -> set[str]:
        """Open again the channels whose connection ended (and ``also``); their names.

        ZMQ drops a connection when the kernel sends a frame over the per-message limit,
        and the guard cuts one that holds an unfinished message over its bound; what was
        in flight on it is lost.  Either way the channel's route is closed
        (``channels.py`` says why no ZMQ monitor is asked).
        """
        lost = self.channels.lost() | (also or set())
        self._resubscribe_needed |= "iopub" in lost
        for name in lost:
            log.warning("the kernel's %s connection was dropped; reopening it", name)
            self.channels.connect(name)
        return lost

    async def _resubscribe(self, timeout: float = 5) -> None:
        """Wait until a new iopub socket receives (ZMQ subscribes asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = self._request("kernel_info_request")
            with contextlib.suppress(Empty):
                while True:
                    msg = await self._get_msg("iopub", 0.2)
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
                msg = await self._get_msg("shell", max(0.0, left))
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

    async def _get_msg(self, name: str, timeout: float) -> dict[str, Any] | None:
        """The next message on channel ``name``, verified and parsed.

        Every message read from the kernel goes through here (its size is reported to
        the channel's guard route by ``Channel.receive``).  Raises ``Empty`` after
        ``timeout`` seconds; returns None for a message with a bad signature (dropped, as
        a forged one would be) and when another reader took the message it woke for (the
        caller asks again).
        """
        channel = self.channels.open[name]
        if not channel.readable() and not await channel.wait(timeout):
            raise Empty
        frames = channel.receive()
        if frames is None:
            return None
        msg = self.channels.parse(frames)
        if msg is None:
            log.warning("dropped a message with an invalid signature from the kernel")
        return msg

    def close(self) -> None:
        """Close the channels (and their routes) and the pinned descriptors."""
        self.channels.close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
