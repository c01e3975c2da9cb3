"""The end of one call (:class:`kernel_sandbox.kernel.execution.Call`): its idle status
and its execute_reply come on two sockets, read apart, in either order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kernel_sandbox.kernel import execution
from kernel_sandbox.kernel.execution import LIVENESS_POLL, Call

IDLE = {
    "header": {"msg_type": "status"},
    "parent_header": {"msg_id": "m"},
    "content": {"execution_state": "idle"},
}
REPLY = {"status": "ok", "execution_count": 3}


class Session:
    """What a Call reads of its kernel session: a reply ``lag`` seconds after it is
    first asked for (None: never)."""

    def __init__(self, lag: float | None) -> None:
        self.lag = lag
        self.max_message_bytes = 1 << 20

    def _request(self, msg_type: str) -> str:
        return msg_type

    def _iopub_moved(self) -> int:
        return 0

    def _iopub_held(self) -> bool:
        return False

    def _relink(self) -> set[str]:
        return set()

    async def _reply(self, msg_ids: set[str], wait: float) -> dict[str, Any] | None:
        if self.lag is not None and self.lag <= wait:
            await asyncio.sleep(self.lag)
            return REPLY
        await asyncio.sleep(wait)
        return None


def _call(session: Session) -> Call:
    async def alive() -> None:
        return None

    return Call(
        session,  # type: ignore[arg-type]
        "m",
        timeout=30,
        interrupt_grace=1,
        check_alive=alive,
        on_output=None,
        max_output_bytes=1 << 20,
    )


async def test_a_reply_just_after_the_idle_ends_the_call_at_once() -> None:
    call = _call(Session(lag=0.02))
    began = time.monotonic()
    ended = await call.on_message(IDLE)
    assert ended is not None and ended.outcome == "finished" and ended.reply == REPLY
    assert time.monotonic() - began < LIVENESS_POLL  # not at the next silent poll


async def test_an_idle_without_a_reply_does_not_end_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(execution, "REPLY_AFTER_IDLE", 0.05)
    call = _call(Session(lag=None))  # the code forged the idle: its cell still runs
    assert await call.on_message(IDLE) is None
    assert call.reply is None
