"""The live page shows a running call's outputs as they come, keeping at most
LIVE_CALL_OUTPUT_BYTES of them: a cell that prints without pause costs the server that
much, whatever it prints (the call's result still has every output)."""

from __future__ import annotations

from pathlib import Path

from kernel_sandbox.limits import LIVE_CALL_OUTPUT_BYTES
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.sandbox import AsyncSandbox
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
