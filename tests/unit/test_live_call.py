"""The live page shows a running call's outputs as they come, keeping at most
LIVE_CALL_OUTPUT_BYTES of them: a cell that prints without pause costs the server that
much, whatever it prints (the call's result still has every output)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel_sandbox import limits
from kernel_sandbox.limits import LIVE_CALL_OUTPUT_BYTES
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.server import live
from kernel_sandbox.server.tenancy import Lease

PIECE = 64 * 1024


async def test_a_flood_of_outputs_is_shown_up_to_the_cap(
    idle_sandbox: AsyncSandbox, tmp_path: Path
) -> None:
    lease = Lease("sb-1", "key-a", "python", idle_sandbox, NotebookRecorder(tmp_path / "s.ipynb"))
    on_output = lease.watch_outputs("while True: print('x' * 65536)")
    for _ in range(10 * LIVE_CALL_OUTPUT_BYTES // PIECE):
        on_output({"output_type": "stream", "name": "stdout", "text": "x" * PIECE})
    assert lease.running is not None
    shown = lease.running["outputs"]
    assert 0 < sum(len(str(o)) for o in shown) <= LIVE_CALL_OUTPUT_BYTES
    assert len(shown) < LIVE_CALL_OUTPUT_BYTES // PIECE
    lease.done_running()
    assert lease.running is None


async def test_a_long_poll_of_a_quiet_session_is_held_at_most_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.5 s for the product's 20: a limit raised past 20 minutes outlasts the guard below
    monkeypatch.setattr(live, "LIVE_POLL_SECONDS", limits.LIVE_POLL_SECONDS / 40)
    recorder = NotebookRecorder(tmp_path / "s.ipynb")
    seen = recorder.version
    # nothing changes: the page's request is answered "no change" at the limit (the
    # guard only turns a hang into a failure)
    await asyncio.wait_for(live._changed(recorder, seen), 30)
    assert recorder.version == seen and not recorder._watchers  # it stopped watching
