"""An E2B command (``kernel_sandbox.server.e2b.process.Command``) on the real sandbox
code (LocalKernelHost): what its stream costs the server when a subscriber stalls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox.backends.base import ExecResult
from kernel_sandbox.limits import E2B_SUBSCRIBER_QUEUE
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.server.e2b.envd.process import process_pb as pb
from kernel_sandbox.server.e2b.process import Command
from kernel_sandbox.server.e2b.state import E2bSandbox
from kernel_sandbox.server.tenancy import Lease
from tests.waiting import await_for

from .conftest import NewSandbox

MiB = 1024 * 1024
#: A frame's most: 64 KiB of output and its 5-byte head (``programs/e2b_process.py``).
FRAME = 64 * 1024 + 5


async def test_a_stalled_subscriber_holds_the_command_not_the_servers_memory(
    new_sandbox: NewSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = await new_sandbox()
    record = E2bSandbox(
        id="s", owner="k", template="base", metadata={}, envs={},
        cpu_count=1, memory_mb=512, disk_mb=1024, end_at=0.0,
    )  # fmt: skip
    lease = Lease("s", "k", "python", sb, NotebookRecorder(tmp_path / "s.ipynb"))
    taken = 0  # bytes of frames the server took from the sandbox
    streamed = sb.host.exec_stream

    async def counted(
        argv: list[str], *, stdout: Callable[[bytes], Awaitable[None]], **kw: Any
    ) -> ExecResult:
        async def count(piece: bytes) -> None:
            nonlocal taken
            taken += len(piece)
            await stdout(piece)

        return await streamed(argv, stdout=count, **kw)

    monkeypatch.setattr(sb.host, "exec_stream", counted)
    flood = "import sys; sys.stdout.buffer.write(b'x' * (32 << 20))"  # 32 MiB
    config = pb.ProcessConfig(cmd="python3", args=["-c", flood])
    command = Command(record, lease, config, None, None, False)
    queue = command.subscribe()
    await command.start()
    # nobody reads the subscriber: its queue fills and the command waits, as on a pipe
    await await_for(queue.full, timeout=10, what="the stalled subscriber's queue to fill")
    assert taken <= (E2B_SUBSCRIBER_QUEUE + 2) * FRAME + 64 * 1024 < 32 * MiB
    assert command.ended is None
    # the subscriber reads again: every byte comes, and the command's end
    got, ends = 0, []
    while (event := await queue.get()) is not None:
        assert event.event is not None
        value = event.event.value
        if isinstance(value, pb.ProcessEvent.DataEvent):
            assert value.output is not None
            got += len(value.output.value)
        elif isinstance(value, pb.ProcessEvent.EndEvent):
            ends.append(value.exit_code)
    assert (got, ends) == (32 * MiB, [0])
    await command.stop()
