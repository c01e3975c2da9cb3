"""One execute request in flight: a small state machine over three events.

:meth:`KernelSession.execute <kernel_sandbox.kernel.client.KernelSession.execute>` sends
the request and hands it to a :class:`Call`, which only reacts — before every read of
iopub to the **deadline**, then to what the read gave:

- **deadline** (looked at before every read, not only when iopub is silent: a cell that
  prints without pause must be interrupted too): at ``timeout`` the kernel is
  interrupted and given ``interrupt_grace`` seconds; ``DRAIN_LIMIT`` seconds past that
  it is ``stuck`` however much it still sends.
- **message** of this request: an output is collected (and shown to ``on_output`` until
  the interrupt); an ``idle`` status ends the call once the execute_reply is read. The
  kernel replies before it goes idle, so the reply is normally queued already, or
  follows on shell within moments (the two sockets are read apart); it is waited for
  ``REPLY_AFTER_IDLE`` seconds and ends the call when it comes.  An idle without a reply
  by then was forged by the code (it can publish with the request's id): the call goes
  on.  (A kernel whose idle may pass its outputs, Deno's, has its idle held by the
  sandbox's relay.)
- **silence** (nothing for ``LIVENESS_POLL`` seconds): dropped connections are reopened;
  once replied, silence ends the call (its idle was lost) unless a big message is still
  arriving; before the reply, a reply read now ends it at the next silence (the idle is
  lost when iopub's connection was dropped); else a kernel silent before its deadline is
  asked whether it lives (``died``), and one silent past the grace is ``stuck``.

The states are the two facts these events change: *interrupted* (``running`` →
``interrupted``) and *replied* (``reply`` read or not).  Ends: ``finished``,
``interrupted``, ``stuck``, ``died``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from queue import Empty
from typing import TYPE_CHECKING, Any, Literal

from ..limits import DRAIN_LIMIT, REPLY_AFTER_IDLE
from .outputs import OutputCollector

if TYPE_CHECKING:
    from .client import KernelSession

__all__ = ["Call", "Outcome", "OutputCallback", "RawExecution"]

log = logging.getLogger(__name__)

Output = dict[str, Any]
OutputCallback = Callable[[Output], Any]
#: Returns None while the kernel lives, else a sentence saying why it died.
AliveCheck = Callable[[], Awaitable[str | None]]
Outcome = Literal["finished", "interrupted", "stuck", "died"]

#: How long the iopub stream may be silent before the kernel's liveness is checked.
LIVENESS_POLL = 0.5
#: The reply of a request whose execute_reply was dropped with shell's connection.
LOST_REPLY = {
    "status": "error",
    "ename": "ReplyTooLarge",
    "evalue": "the kernel's reply was over the per-message limit and was dropped unread",
}


@dataclass
class RawExecution:
    """What the kernel said about one request, before the sandbox adds its judgement.

    ``truncated_bytes`` counts the output dropped by the output cap.
    """

    outcome: Outcome
    outputs: list[Output] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)
    death_reason: str = ""
    truncated_bytes: int = 0
    display_ids: dict[str, list[int]] = field(default_factory=dict)
    display_updates: dict[str, dict[str, Any]] = field(default_factory=dict)


class Call:
    """The state of one request ``msg_id`` sent on ``session``; :meth:`run` drives it."""

    __slots__ = (
        "_loop",
        "check_alive",
        "collector",
        "deadline",
        "drain_until",
        "dropped",
        "grace",
        "interrupted",
        "iopub_moved",
        "msg_id",
        "on_output",
        "probes",
        "reply",
        "session",
    )

    def __init__(
        self,
        session: KernelSession,
        msg_id: str,
        *,
        timeout: float,
        interrupt_grace: float,
        check_alive: AliveCheck,
        on_output: OutputCallback | None,
        max_output_bytes: int,
    ) -> None:
        self.session = session
        self.msg_id = msg_id
        self.check_alive = check_alive
        self.on_output = on_output
        self.grace = interrupt_grace
        self.collector = OutputCollector(max_output_bytes)
        #: Once shell's connection was dropped, the execute_reply may be lost with it: a
        #: kernel_info request sent then is answered only after this request is done.
        #: One is sent at each look (the new connection may not be routed yet).
        self.probes: set[str] = set()
        #: A connection was dropped: said in the result of a call that ends normally (a
        #: dying kernel drops its connections too, and its result says so already).
        self.dropped = False
        self._loop = asyncio.get_running_loop()
        self.deadline = self._loop.time() + timeout
        self.interrupted = False
        self.drain_until = 0.0
        self.iopub_moved = session._iopub_moved()
        self.reply: dict[str, Any] | None = None

    async def run(self) -> RawExecution:
        """Read iopub until one of the events ends the call; its result."""
        session = self.session
        msg_id = self.msg_id
        while True:
            end = self.on_deadline()
            if end is None:
                try:
                    msg = await session._get_msg("iopub", self.wait())
                except Empty:
                    end = await self.on_silence()
                else:
                    if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                        end = await self.on_message(msg)
            if end is not None:
                return end

    def on_deadline(self) -> RawExecution | None:
        """Interrupt at the deadline; ``stuck`` once the drain after the grace is over."""
        now = self._loop.time()
        if now >= self.deadline and not self.interrupted:
            self.session.interrupt()
            self.interrupted = True
            self.deadline = now + self.grace
            self.drain_until = self.deadline + DRAIN_LIMIT
        elif self.interrupted and now >= self.drain_until:
            return self.result("stuck")
        return None

    def wait(self) -> float:
        """How long the next read may wait for a message before it counts as silence."""
        left = self.deadline - self._loop.time()
        # past the grace, a kernel is stuck once it stays silent for a poll
        wait = LIVENESS_POLL if self.interrupted and left <= 0 else min(left, LIVENESS_POLL)
        return max(0.0, wait)

    async def on_message(self, msg: dict[str, Any]) -> RawExecution | None:
        """An iopub message of this request: an output, or the status that may end it."""
        if msg["header"]["msg_type"] == "status":
            if msg["content"].get("execution_state") == "idle":
                if self.reply is None:  # shell is read apart: it may lag the idle by a hair
                    self.reply = await self._ended(REPLY_AFTER_IDLE)
                if self.reply is not None:
                    return self.finish()
                self._relink()
                log.warning("ignored an idle status without an execute_reply")
            return None
        shown = self.collector.add(msg)
        # Once interrupted, the queued backlog is drained at full speed: a slow
        # listener must not make a kernel that did stop look stuck.
        if shown is not None and self.on_output is not None and not self.interrupted:
            await _notify(self.on_output, shown)
        return None

    async def on_silence(self) -> RawExecution | None:
        """Nothing on iopub for a poll: a lost idle, a dead kernel, or a stuck one."""
        self._relink()
        if self.reply is not None:  # replied, then silent: its idle was lost
            if (moved := self.session._iopub_moved()) != self.iopub_moved:
                self.iopub_moved = moved  # not silent: a big message is on its way
                return None
            return self.finish()
        # The idle status is lost when iopub's connection was dropped (or the kernel
        # dropped it from a full queue); the reply then ends the call.
        self.reply = await self._ended(0)
        if self.reply is not None:
            return None
        if self._loop.time() < self.deadline:  # silent before its deadline: dead, or busy?
            reason = await self.check_alive()
            if reason:
                return self.result("died", death_reason=reason)
        elif self.interrupted:  # silent after the grace: the interrupt did not work
            return self.result("stuck")
        return None

    def finish(self) -> RawExecution:
        """The result of a call the kernel ended: ``finished`` or ``interrupted``."""
        session = self.session
        held = session._iopub_held()  # unread past the bound
        if self.dropped or session._relink() or held:
            self.collector.note_lost(session.max_message_bytes)
        outcome: Outcome = "interrupted" if self.interrupted else "finished"
        return self.result(outcome, reply=self.reply or {})

    def result(self, outcome: Outcome, **details: Any) -> RawExecution:
        """What was collected, as a :class:`RawExecution` with ``outcome``."""
        collector = self.collector
        outputs = collector.outputs
        updates = {k: {"data": d, "metadata": m} for k, (d, m) in collector.display_updates.items()}
        return RawExecution(
            outcome,
            outputs,
            truncated_bytes=collector.truncated_bytes,
            display_ids=collector.display_ids(outputs),
            display_updates=updates,
            **details,
        )

    def _relink(self) -> None:
        """Reopen dropped connections; probe for the reply if shell's was one of them."""
        lost = self.session._relink()
        self.dropped = self.dropped or bool(lost)
        if "shell" in lost or 0 < len(self.probes) < 20:
            self.probes.add(self.session._request("kernel_info_request"))

    async def _ended(self, wait: float) -> dict[str, Any] | None:
        """The execute_reply (or, once shell was dropped, a probe's) within ``wait``."""
        if not self.probes:
            return await self.session._reply({self.msg_id}, wait)
        return LOST_REPLY if await self.session._reply(self.probes, wait) is not None else None


async def _notify(callback: OutputCallback, output: Output) -> None:
    try:
        result = callback(output)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.warning("on_output callback raised; the execution goes on", exc_info=True)
