"""An E2B command (``kernel_sandbox.server.e2b.process.Command``) on the real sandbox
code (LocalKernelHost): what its stream, its framing and its control writes cost the
server when a subscriber stalls or the sandbox's own code gets in the way."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from connectrpc.errors import ConnectError

from kernel_sandbox import limits
from kernel_sandbox.backends.base import ExecResult
from kernel_sandbox.errors import FileOperationError
from kernel_sandbox.limits import E2B_MAX_FRAME, E2B_SUBSCRIBER_QUEUE
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.processes import InteractiveProcess
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.server.e2b import process
from kernel_sandbox.server.e2b.envd.process import process_pb as pb
from kernel_sandbox.server.e2b.process import Command
from kernel_sandbox.server.e2b.state import E2bSandbox
from kernel_sandbox.server.tenancy import Lease
from tests.waiting import await_for

from .conftest import NewSandbox, StandInPython

MiB = 1024 * 1024
#: A frame's most: 64 KiB of output and its 5-byte head (``programs/e2b_process.py``).
FRAME = 64 * 1024 + 5


def _command(sb: AsyncSandbox, tmp_path: Path, *argv: str, stdin: bool = False) -> Command:
    """A command as the process service makes it (not started), for sandbox ``sb``."""
    record = E2bSandbox(
        id="s", owner="k", template="base", metadata={}, envs={},
        cpu_count=1, memory_mb=512, disk_mb=1024, end_at=0.0,
    )  # fmt: skip
    lease = Lease("s", "k", "python", sb, NotebookRecorder(tmp_path / "s.ipynb"))
    config = pb.ProcessConfig(cmd=argv[0], args=list(argv[1:]))
    return Command(record, lease, config, None, None, stdin)


def _count_taken(sb: AsyncSandbox, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the bytes the server takes from the sandbox's streamed processes."""
    taken = 0
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
    return lambda: taken


async def _events(queue: asyncio.Queue[pb.ProcessEvent | None]) -> tuple[int, list[Any]]:
    """Bytes of output a subscriber gets to its stream's end, and the end events."""
    got, ends = 0, []
    while (event := await queue.get()) is not None:
        assert event.event is not None
        value = event.event.value
        if isinstance(value, pb.ProcessEvent.DataEvent):
            assert value.output is not None
            got += len(value.output.value)
        elif isinstance(value, pb.ProcessEvent.EndEvent):
            ends.append(value)
    return got, ends


async def test_a_stalled_subscriber_holds_the_command_not_the_servers_memory(
    new_sandbox: NewSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = await new_sandbox()
    taken = _count_taken(sb, monkeypatch)  # bytes of frames the server took from the sandbox
    flood = "import sys; sys.stdout.buffer.write(b'x' * (32 << 20))"  # 32 MiB
    command = _command(sb, tmp_path, "python3", "-c", flood)
    queue = command.subscribe()
    await command.start()
    # nobody reads the subscriber: its queue fills and the command waits, as on a pipe
    await await_for(queue.full, timeout=10, what="the stalled subscriber's queue to fill")
    assert taken() <= (E2B_SUBSCRIBER_QUEUE + 2) * FRAME + 64 * 1024 < 32 * MiB
    assert command.ended is None
    # the subscriber reads again: every byte comes, and the command's end
    got, ends = await _events(queue)
    assert (got, [end.exit_code for end in ends]) == (32 * MiB, [0])
    await command.stop()


async def test_a_module_in_the_working_directory_does_not_stand_in_for_the_program(
    new_sandbox: NewSandbox, tmp_path: Path
) -> None:
    sb = await new_sandbox()
    # the program runs isolated (``-I``): a base64.py there is not what it imports
    await sb.files.write("base64.py", "import sys\nsys.stdout.write('forged')\nsys.exit(0)\n")
    command = _command(sb, tmp_path, "echo", "heard")
    queue = command.subscribe()
    await command.start()
    got = b""
    while (event := await queue.get()) is not None:
        assert event.event is not None
        value = event.event.value
        if isinstance(value, pb.ProcessEvent.DataEvent):
            assert value.output is not None
            got += value.output.value
        elif isinstance(value, pb.ProcessEvent.EndEvent):
            assert (value.exit_code, value.error) == (0, "")
    assert got == b"heard\n"
    # the same program runs the sandbox's interactive processes (kernel_sandbox.processes)
    process = InteractiveProcess(sb, ["echo", "heard"])
    await process.start()
    await await_for(lambda: process.ended, timeout=30, what="the process's end")
    assert (await process.take(), process.exit_code, process.error) == (b"heard\n", 0, "")


async def test_a_frame_past_its_cap_ends_the_command_and_is_never_held(
    new_sandbox: NewSandbox,
    stand_in_python: StandInPython,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sb = await new_sandbox(env_vars=stand_in_python.env)
    taken = _count_taken(sb, monkeypatch)
    # The program runs with the sandbox's own ``python3``: one that is not Python's
    # announces an 8 MiB frame, then sends it.
    stand_in_python.set(
        "import sys\n"
        "sys.stdout.buffer.write(b'O' + (8 << 20).to_bytes(4, 'big') + b'x' * (8 << 20))\n"
    )
    command = _command(sb, tmp_path, "true")
    queue = command.subscribe()
    with pytest.raises(ConnectError, match="framing"):  # as the service's Start reports it
        await command.start()
    got, ends = await _events(queue)
    assert got == 0 and [e.status for e in ends] == ["error"] and "framing" in ends[0].error
    assert taken() <= E2B_MAX_FRAME < 8 * MiB  # the head was enough: the rest never held


async def test_a_control_write_the_sandbox_blocks_holds_the_server_only_to_its_deadline(
    new_sandbox: NewSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.5 s for the product's 15: a cap raised past 7 minutes outlasts the guard below
    deadline = limits.E2B_CONTROL_DEADLINE / 30
    monkeypatch.setattr(process, "E2B_CONTROL_DEADLINE", deadline)
    sb = await new_sandbox()
    command = _command(sb, tmp_path, "sleep", "600", stdin=True)
    queue = command.subscribe()
    pid = await command.start()
    await command.control({"stdin": base64.b64encode(b"heard\n").decode()})
    # the sandbox's own code puts a FIFO nobody reads where the command's control was
    fifo = f"{command._ctl}/ctl"
    await sb.run_python(f"import os; os.unlink({fifo!r}); os.mkfifo({fifo!r})")
    with pytest.raises(FileOperationError, match=re.escape(f"within {deadline:g}s")):
        # the guard only turns a hang into a failure: the deadline ends the call first
        await asyncio.wait_for(command.control({"signal": 15}), 30)
    await sb.run_python(f"import os; os.kill({pid}, 9)")  # the sandbox ends its command
    _, ends = await _events(queue)  # its end still comes: the server holds nothing of it
    assert [e.status for e in ends] == ["signal: kill"]
