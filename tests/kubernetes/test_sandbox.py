"""AsyncSandbox on the kubernetes host: the behaviours that matter, on a real cluster."""

from __future__ import annotations

import asyncio

import pytest

from kernel_sandbox.errors import FileOperationError
from tests.kubernetes.conftest import DATASCIENCE_IMAGE
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes


async def test_state_plots_shell_and_files(make_sandbox) -> None:
    sb = await make_sandbox(image=DATASCIENCE_IMAGE)
    first = await sb.run_python("x = 41\nprint('set')")
    second = await sb.run_python("x + 1")
    assert first.status == "ok" and first.stdout == "set\n"
    assert second.result is not None and second.result["data"]["text/plain"] == "42"
    plot = await sb.run_python(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"
    )
    assert plot.status == "ok", plot.text
    (png,) = plot.images("image/png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    shell = await sb.run_shell("echo $HOME; id -u; pwd; echo err >&2; exit 4", env={"A": "1"})
    assert shell.exit_code == 4
    assert shell.stdout.split() == ["/home/sandbox", "1000", "/sandbox"]
    assert shell.stderr.startswith("err")
    slow = await sb.run_shell("sleep 30", timeout=1)
    assert slow.timed_out
    await sb.files.write("data/in.csv", "a,b\n1,2\n")
    assert [f.name for f in await sb.files.list("data")] == ["in.csv"]
    seen = await sb.run_python("print(open('data/in.csv').read().splitlines()[1])")
    assert seen.stdout == "1,2\n"
    await sb.run_python("open('out.bin', 'wb').write(bytes(range(256)))")
    assert await sb.files.read("out.bin") == bytes(range(256))
    with pytest.raises(FileOperationError):
        await sb.files.write("/etc/passwd", "x")


async def test_timeout_keeps_state_and_stuck_code_is_restarted(make_sandbox) -> None:
    sb = await make_sandbox(interrupt_grace=0.5)
    await sb.run_python("kept = 'yes'")
    ex = await sb.run_python("import time\nprint('start')\ntime.sleep(60)", timeout=1)
    assert ex.status == "timeout" and not ex.state_lost
    assert ex.stdout == "start\n" and "kept" in ex.message
    assert (await sb.run_python("kept")).text == "'yes'"
    await sb.run_shell("echo kept > kept.txt")
    stuck = await sb.run_python(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
        timeout=1,
    )
    assert stuck.status == "timeout" and stuck.state_lost
    assert "restarted" in stuck.message and "files" not in stuck.message
    after = await sb.run_python("'kept' in dir(), open('kept.txt').read()")
    assert after.text == "(False, 'kept\\n')"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os; os._exit(3)", "exited with code 3"),
        ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
    ],
)
async def test_kernel_crash_is_reported_and_recovered(make_sandbox, code: str, reason: str) -> None:
    sb = await make_sandbox()
    await sb.run_python("before = 1")
    await sb.files.write("survives.txt", "file")
    ex = await sb.run_python(code)
    assert ex.status == "kernel_died" and ex.state_lost
    assert reason in ex.message and "restarted" in ex.message
    after = await sb.run_python("print('alive')\n'before' in dir()")
    assert after.stdout == "alive\n" and after.text.endswith("False")
    assert await sb.files.read_text("survives.txt") == "file"


async def test_out_of_memory_is_named_and_recovered(make_sandbox) -> None:
    sb = await make_sandbox(memory_limit="300m", disk_limit="32m")
    hog = "blocks = []\nwhile True:\n    blocks.append(b'x' * 50_000_000)"
    for _ in range(2):  # the second OOM kill is told apart from the first
        ex = await sb.run_python(hog)
        assert ex.status == "kernel_died", ex.message
        assert "out of memory" in ex.message
        assert (await sb.run_python("2 * 21")).text == "42"
    crash = await sb.run_python("import os; os._exit(5)")
    assert "exited with code 5" in crash.message and "memory" not in crash.message


async def test_restart_loses_variables_and_ends_processes_keeps_files(make_sandbox) -> None:
    sb = await make_sandbox()
    await sb.run_python("v = 1\nopen('f.txt', 'w').write('kept')")
    await sb.run_shell("nohup sleep 900 >/dev/null 2>&1 &")
    await sb.restart()
    count = (
        "import os\nprint(sum(open(f'/proc/{p}/cmdline','rb').read().startswith(b'sleep')"
        " for p in os.listdir('/proc') if p.isdigit()))"
    )
    ex = await sb.run_python(f"print('v' in dir(), open('f.txt').read())\n{count}")
    assert ex.stdout == "False kept\n0\n"


async def test_the_host_interrupts_a_running_cell_and_keeps_the_kernel(make_sandbox) -> None:
    sb = await make_sandbox()
    await sb.run_python("kept = 5")
    running = asyncio.ensure_future(
        sb.run_python("import time\nopen('started', 'w').close()\ntime.sleep(60)")
    )
    # the cell runs: SIGINT reaches it
    await await_for(lambda: sb.files.exists("started"), 60, what="the cell to start")
    await sb.host.interrupt()
    interrupted = await asyncio.wait_for(running, 30)
    assert interrupted.status == "error" and interrupted.error is not None
    assert interrupted.error.ename == "KeyboardInterrupt"
    assert (await sb.run_python("kept")).text == "5"
