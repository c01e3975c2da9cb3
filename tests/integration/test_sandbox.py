"""The core sandbox against a real engine and real kernels."""

from __future__ import annotations

import asyncio
import os

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.results import Execution
from kernel_sandbox.rundirs import runtime_root
from kernel_sandbox.sandbox import AsyncSandbox
from tests.conftest import require
from tests.integration.conftest import GVISOR
from tests.waiting import await_for

pytestmark = pytest.mark.integration


async def _leave_files(sb: AsyncSandbox) -> tuple[str | None, str]:
    """Write a file in the working directory and one on the container's own tmpfs.

    ``/dev/shm`` is wiped when the container restarts, as RAM-backed sandbox storage
    is; the container's id and start time are returned to compare after a restart.
    """
    r = await sb.run_shell("echo kept > kept.txt && echo kept > /dev/shm/kept")
    assert r.exit_code == 0, r.stderr
    return sb.container_id, _started_at(sb)


def _started_at(sb: AsyncSandbox) -> str:
    from kernel_sandbox.backends.docker import docker_client

    assert sb.container_id is not None
    return str(docker_client().api.inspect_container(sb.container_id)["State"]["StartedAt"])


async def _assert_restarted_in_place(sb: AsyncSandbox, before: tuple[str | None, str]) -> None:
    """Same container, never restarted, and both files still there."""
    assert (sb.container_id, _started_at(sb)) == before
    r = await sb.run_shell("cat kept.txt /dev/shm/kept")
    assert r.stdout == "kept\nkept\n", r.stderr


async def test_state_persists_between_calls(py_sandbox: AsyncSandbox) -> None:
    first = await py_sandbox.run_python("x = 41\nprint('set')")
    second = await py_sandbox.run_python("x + 1")
    assert first.status == "ok" and first.stdout == "set\n"
    assert second.status == "ok" and second.result is not None
    assert second.result["data"]["text/plain"] == "42"
    assert second.execution_count == (first.execution_count or 0) + 1


async def test_the_kernel_starts_without_all_of_jupyter_client(py_sandbox: AsyncSandbox) -> None:
    """The launcher skips jupyter_client's package __init__ (cold start); user code still
    gets the whole package, and the garbage collector, off while starting, is on."""
    lean = await py_sandbox.run_python(
        "import gc, sys\nprint(gc.isenabled(), 'jupyter_client.manager' in sys.modules)"
    )
    assert lean.stdout == "True False\n", lean
    whole = await py_sandbox.run_python(
        "import jupyter_client\n"
        "from jupyter_client import AsyncKernelClient\n"
        "print(jupyter_client.__version__ == jupyter_client._version.__version__,"
        " jupyter_client.KernelManager.__name__, AsyncKernelClient.__name__,"
        " 'run_kernel' in dir(jupyter_client))"
    )
    assert whole.stdout == "True KernelManager AsyncKernelClient True\n", whole


async def test_matplotlib_plot_comes_back_as_png(sandbox: AsyncSandbox) -> None:
    ex = await sandbox.run_python(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"
    )
    assert ex.status == "ok", ex.text
    images = ex.images("image/png")
    assert len(images) == 1 and images[0].startswith(b"\x89PNG\r\n\x1a\n")
    assert "<image/png" in ex.text and "iVBOR" not in ex.text


async def test_dataframe_result_has_html_and_plain_text(sandbox: AsyncSandbox) -> None:
    ex = await sandbox.run_python("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert ex.status == "ok", ex.text
    assert ex.result is not None
    assert "<table" in ex.result["data"]["text/html"]
    assert "a  b" in ex.result["data"]["text/plain"]


async def test_user_error_is_data_with_a_clean_traceback(py_sandbox: AsyncSandbox) -> None:
    ex = await py_sandbox.run_python("def f():\n    return 1 / 0\nf()")
    assert ex.status == "error" and not ex.ok
    assert ex.error is not None and ex.error.ename == "ZeroDivisionError"
    assert any("return 1 / 0" in line for line in ex.error.traceback)
    assert "\x1b[" not in "".join(ex.error.traceback)
    assert "ZeroDivisionError: division by zero" in ex.text
    assert (await py_sandbox.run_python("1 + 1")).status == "ok"


async def test_outputs_keep_order_and_display_updates(py_sandbox: AsyncSandbox) -> None:
    ex = await py_sandbox.run_python(
        "import sys\nfrom IPython.display import display, clear_output\n"
        "print('a', flush=True); print('b', file=sys.stderr, flush=True); print('c', flush=True)\n"
        "h = display('v1', display_id=True)\nh.update('v2')\n"
        "'last'"
    )
    kinds = [(o["output_type"], o.get("name")) for o in ex.outputs]
    assert kinds == [
        ("stream", "stdout"),
        ("stream", "stderr"),
        ("stream", "stdout"),
        ("display_data", None),
        ("execute_result", None),
    ]
    assert ex.outputs[3]["data"]["text/plain"] == "'v2'"
    cleared = await py_sandbox.run_python(
        "from IPython.display import clear_output\nprint('gone')\nclear_output()\nprint('kept')"
    )
    assert cleared.stdout == "kept\n"


async def test_on_output_sees_outputs_as_they_arrive(py_sandbox: AsyncSandbox) -> None:
    seen_sync: list[str] = []
    seen_async: list[str] = []

    async def on_async(out: dict) -> None:  # type: ignore[type-arg]
        seen_async.append(out.get("text", ""))

    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)"
    await py_sandbox.run_python(code, on_output=lambda o: seen_sync.append(o.get("text", "")))
    await py_sandbox.run_python(code, on_output=on_async)
    assert "".join(seen_sync) == "0\n1\n2\n" and len(seen_sync) == 3
    assert "".join(seen_async) == "0\n1\n2\n"


async def test_timeout_interrupts_and_keeps_state(py_sandbox: AsyncSandbox) -> None:
    await py_sandbox.run_python("kept = 'yes'")
    ex = await py_sandbox.run_python("import time\nprint('start')\ntime.sleep(60)", timeout=1)
    assert ex.status == "timeout" and not ex.state_lost
    assert ex.stdout == "start\n"
    assert "interrupted" in ex.message and "kept" in ex.message
    assert (await py_sandbox.run_python("kept")).text == "'yes'"


async def test_uninterruptible_code_restarts_the_kernel_and_says_so(
    make_sandbox,  # type: ignore[no-untyped-def]
) -> None:
    sb = await make_sandbox(image="kernel-sandbox:python", interrupt_grace=0.5)
    await sb.run_python("lost = 1")
    before = await _leave_files(sb)
    ex = await sb.run_python(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
        timeout=1,
    )
    assert ex.status == "timeout" and ex.state_lost
    assert "restarted" in ex.message and "lost" in ex.message
    assert "files" not in ex.message
    after = await sb.run_python("'lost' in dir()")
    assert after.status == "ok" and after.text == "False"
    await _assert_restarted_in_place(sb, before)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os; os._exit(3)", "exited with code 3"),
        ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
    ],
)
async def test_kernel_crash_is_reported_and_recovered(
    py_sandbox: AsyncSandbox, code: str, reason: str
) -> None:
    await py_sandbox.run_python("before = 1")
    await py_sandbox.files.write("survives.txt", "file")
    before = await _leave_files(py_sandbox)
    ex = await py_sandbox.run_python(code)
    assert ex.status == "kernel_died" and ex.state_lost
    assert reason in ex.message and "restarted" in ex.message
    after = await py_sandbox.run_python("print('alive')\n'before' in dir()")
    assert after.stdout == "alive\n" and after.text.endswith("False")
    assert await py_sandbox.files.read_text("survives.txt") == "file"
    await _assert_restarted_in_place(py_sandbox, before)


async def test_out_of_memory_is_named_and_recovered(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb = await make_sandbox(image="kernel-sandbox:python", memory_limit="200m")
    before = await _leave_files(sb)
    hog = "blocks = []\nwhile True:\n    blocks.append(b'x' * 50_000_000)"
    for _ in range(2):  # the second OOM kill is told apart from the first
        ex = await sb.run_python(hog)
        assert ex.status == "kernel_died"
        assert "out of memory" in ex.message
        assert (await sb.run_python("2 * 21")).text == "42"
    if GVISOR:  # an OOM ends the whole container there, and the result says files may go
        assert "files" in ex.message
        before = await _leave_files(sb)
    crash = await sb.run_python("import os; os._exit(5)")  # not an OOM kill any more
    assert "exited with code 5" in crash.message and "memory" not in crash.message
    await _assert_restarted_in_place(sb, before)


async def test_input_is_a_clear_error_not_a_hang(py_sandbox: AsyncSandbox) -> None:
    ex = await py_sandbox.run_python("input('name? ')", timeout=10)
    assert ex.status == "error"
    assert ex.error is not None and ex.error.ename == "StdinNotImplementedError"


async def test_concurrent_calls_are_serialised(py_sandbox: AsyncSandbox) -> None:
    code = (
        "import time\nfor i in range(5):\n    print('{tag}', i, flush=True)\n    time.sleep(0.02)"
    )
    results: list[Execution] = await asyncio.gather(
        *(py_sandbox.run_python(code.format(tag=t)) for t in ("A", "B", "C"))
    )
    for tag, ex in zip("ABC", results, strict=True):
        assert ex.stdout == "".join(f"{tag} {i}\n" for i in range(5))


async def test_no_network_by_default_and_network_when_enabled(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    probe = (
        "import os, socket\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); out = 'connected'\n"
        "except OSError as e:\n    out = type(e).__name__\n"
        "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]), out)"
    )
    closed = await make_sandbox(image="kernel-sandbox:python")
    ex = await closed.run_python(probe)
    assert ex.stdout.startswith("['lo']") and "connected" not in ex.stdout
    if GVISOR:  # only loopback there: a network is refused, not silently dropped
        with pytest.raises(ConfigError, match=r"network_enabled=True .* cannot hold"):
            await make_sandbox(image="kernel-sandbox:python", network_enabled=True)
        return
    opened = await make_sandbox(image="kernel-sandbox:python", network_enabled=True)
    routes = await opened.run_python("print(open('/proc/net/route').read())")
    assert "eth0" in routes.stdout and "00000000" in routes.stdout  # a default route exists


async def test_runs_as_non_root_without_capabilities(py_sandbox: AsyncSandbox) -> None:
    ex = await py_sandbox.run_python(
        "import os, pwd\nst = open('/proc/self/status').read()\n"
        "cap = [l.split()[1] for l in st.splitlines() if l.startswith('CapEff')][0]\n"
        "import ctypes\nnnp = ctypes.CDLL(None).prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS\n"
        "print(pwd.getpwuid(os.getuid()).pw_name, os.getcwd(), cap, nnp)"
    )
    assert ex.stdout.split() == ["sandbox", "/sandbox", "0000000000000000", "1"]
    shell = await py_sandbox.run_shell("id -un")
    assert shell.stdout.strip() == "sandbox"


async def test_shell_exit_codes_streams_cwd_and_env(py_sandbox: AsyncSandbox) -> None:
    r = await py_sandbox.run_shell("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, "out\n", "err\n", False)
    await py_sandbox.files.mkdir("sub/dir")
    r = await py_sandbox.run_shell('pwd; echo "$GREETING"', cwd="sub/dir", env={"GREETING": "hi"})
    assert r.ok and r.stdout == "/sandbox/sub/dir\nhi\n"


async def test_shell_timeout_kills_the_whole_process_group(py_sandbox: AsyncSandbox) -> None:
    r = await py_sandbox.run_shell("sleep 300 & sleep 301 & echo started; wait", timeout=1)
    assert r.timed_out and not r.ok and r.stdout == "started\n"
    left = await py_sandbox.run_shell("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert "sleep 30" not in left.stdout


async def test_shell_runs_while_the_kernel_is_busy(py_sandbox: AsyncSandbox) -> None:
    busy = asyncio.create_task(
        py_sandbox.run_python("import time\nopen('busy', 'w').close()\ntime.sleep(6)")
    )
    await await_for(lambda: py_sandbox.files.exists("busy"), 60, 0.05, "the cell to start")
    r = await py_sandbox.run_shell("echo beside")
    assert r.stdout == "beside\n" and not busy.done()
    assert (await busy).status == "ok"


async def test_restart_loses_variables_keeps_files(py_sandbox: AsyncSandbox) -> None:
    await py_sandbox.run_python("v = 1\nopen('f.txt', 'w').write('x')")
    before = await _leave_files(py_sandbox)
    await py_sandbox.restart()
    ex = await py_sandbox.run_python("import os\nprint('v' in dir(), os.path.exists('f.txt'))")
    assert ex.stdout == "False True\n"
    await _assert_restarted_in_place(py_sandbox, before)


@pytest.mark.parametrize("crash", [False, True])
async def test_restart_ends_processes_the_kernel_started(
    py_sandbox: AsyncSandbox, crash: bool
) -> None:
    ex = await py_sandbox.run_python(
        "import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nprint(child.pid)"
    )
    cmdline = f"tr '\\0' ' ' < /proc/{ex.stdout.strip()}/cmdline"
    assert (await py_sandbox.run_shell(cmdline)).stdout == "sleep 1000 "
    if crash:
        assert (await py_sandbox.run_python("import os; os._exit(1)")).status == "kernel_died"
    else:
        await py_sandbox.restart()
    gone = await py_sandbox.run_shell(cmdline)
    assert "sleep" not in gone.stdout  # no such process, or the pid was reused


#: Ignores the interrupt, then forks without end, retrying while the limit refuses.
_FORK_BOMB = (
    "import os, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "while True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)"
)


# "held": a bomb in an interpreter of its own (no kernel threads take its places) holds
# the limit long enough for gVisor's host tasks (the ptrace platform's stub threads) to
# near their plateau, which the host pids backstop must leave room for
# (runtimes.gvisor_host_pids; the old, smaller one ended the whole gVisor sandbox).
@pytest.mark.parametrize(
    ("pids_limit", "timeout", "code"),
    [
        (64, 3, _FORK_BOMB),
        (
            32,
            15,
            "import signal, subprocess, sys\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            f"subprocess.run([sys.executable, '-c', {_FORK_BOMB!r}])",
        ),
    ],
    ids=["kernel", "held"],
)
async def test_fork_bomb_is_ended_by_a_restart_in_place(  # type: ignore[no-untyped-def]
    make_sandbox, pids_limit: int, timeout: float, code: str
) -> None:
    # Under gVisor each fork of the kernel costs ~18 MB of host memory: 64 of them need
    # more than the default 1g to meet the pids limit first (docs/how-to/gvisor.md).
    roomy = {"memory_limit": "2g"} if GVISOR else {}
    sb = await make_sandbox(
        image="kernel-sandbox:python", pids_limit=pids_limit, interrupt_grace=0.5, **roomy
    )
    before = await _leave_files(sb)
    ex = await sb.run_python(code, timeout=timeout)
    assert ex.status == "timeout" and ex.state_lost
    assert "restarted" in ex.message and "files" not in ex.message, ex.message
    assert (await sb.run_python("2 * 21")).text == "42"
    await _assert_restarted_in_place(sb, before)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL"])
async def test_signals_to_pid_1_leave_the_sandbox_working(
    py_sandbox: AsyncSandbox, signal_name: str
) -> None:
    before = await _leave_files(py_sandbox)
    # Docker's init forwards the signal to the supervisor; a second later the container
    # would be gone if the supervisor had died of it.
    ex = await py_sandbox.run_python(
        f"import os, signal, time\nkept = 1\nos.kill(1, signal.{signal_name})\ntime.sleep(1)"
    )
    if GVISOR and signal_name == "SIGKILL":
        # gVisor does not shield a namespace's init from SIGKILL: the container ends,
        # which is reported and repaired (docs/how-to/gvisor.md)
        assert ex.status == "kernel_died" and "whole container was restarted" in ex.message
        assert (await py_sandbox.run_python("2 * 21")).text == "42"
        return
    assert ex.status == "ok", ex.message
    assert (await py_sandbox.run_python("kept")).text == "1"
    await _assert_restarted_in_place(py_sandbox, before)


async def test_killed_supervisor_falls_back_to_a_container_restart(
    py_sandbox: AsyncSandbox,
) -> None:
    before = await _leave_files(py_sandbox)
    ex = await py_sandbox.run_python(
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(60)"
    )
    assert ex.status == "kernel_died" and ex.state_lost
    assert "container was restarted" in ex.message and "files" in ex.message
    assert (await py_sandbox.run_python("2 * 21")).text == "42"
    assert _started_at(py_sandbox) != before[1]


async def test_close_leaves_no_container_and_no_host_directory(docker_engine) -> None:  # type: ignore[no-untyped-def]
    sb = await AsyncSandbox.create(
        image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"}
    )
    container_id, run_dir = sb.container_id, runtime_root() / sb.id
    assert run_dir.exists()
    await sb.run_python("1")
    await sb.close()
    await sb.close()  # twice is fine
    assert not run_dir.exists()
    assert not docker_engine.containers.list(all=True, filters={"id": container_id})
    with pytest.raises(Exception, match="closed"):
        await sb.run_python("1")


async def test_volumes_and_env_vars_reach_the_sandbox(make_sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "in.txt").write_text("from host")
    os.chmod(tmp_path, 0o777)
    sb = await make_sandbox(
        image="kernel-sandbox:python",
        env_vars={"MY_SETTING": "on"},
        volumes={str(tmp_path): {"bind": "/sandbox/data", "mode": "rw"}},
    )
    ex = await sb.run_python(
        "import os\nprint(open('data/in.txt').read(), os.environ['MY_SETTING'])\n"
        "open('data/out.txt', 'w').write('from sandbox')"
    )
    assert ex.stdout == "from host on\n"
    assert (tmp_path / "out.txt").read_text() == "from sandbox"


async def test_tcp_transport_without_network(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    if GVISOR:  # the kernel cannot be reached over a network there: refused with a reason
        with pytest.raises(ConfigError, match="transport='tcp' cannot hold"):
            await make_sandbox(image="kernel-sandbox:python", transport="tcp")
        return
    sb = await make_sandbox(image="kernel-sandbox:python", transport="tcp")
    await sb.run_python("y = 2")
    ex = await sb.run_python("import os\nprint(y * 21, sorted(os.listdir('/sys/class/net')))")
    assert ex.stdout.startswith("42 ")
    probe = await sb.run_python(
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('connected')\nexcept OSError:\n    print('blocked')"
    )
    assert probe.stdout == "blocked\n"
    before = await _leave_files(sb)  # no shared directory: the status is read with exec
    crash = await sb.run_python("import os; os._exit(4)")
    assert "exited with code 4" in crash.message and "files" not in crash.message
    assert (await sb.run_python("'y' in dir()")).text == "False"
    await _assert_restarted_in_place(sb, before)


async def test_unclosed_sandbox_is_removed_when_the_program_exits(docker_engine) -> None:  # type: ignore[no-untyped-def]
    program = (
        "import asyncio\nfrom kernel_sandbox import AsyncSandbox\n"
        "async def main():\n"
        "    sb = await AsyncSandbox.create(image='kernel-sandbox:python',"
        " labels={'kernel-sandbox.test': '1'})\n"
        "    print(sb.id, sb.labels['kernel-sandbox.run-dir'])\n"
        "asyncio.run(main())\n"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    sandbox_id, run_dir = done.stdout.split()
    label = f"kernel-sandbox.id={sandbox_id}"
    assert not docker_engine.containers.list(all=True, filters={"label": label})
    assert not os.path.exists(run_dir)


async def test_a_runtime_the_engine_lacks_is_a_config_error(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"no such runtime \(it offers: .*runc"):
        await make_sandbox(image="kernel-sandbox:python", runtime="no-such-runtime")


async def test_runtime_runsc_runs_the_kernel_under_gvisor(make_sandbox, docker_engine) -> None:  # type: ignore[no-untyped-def]
    # Asked for explicitly, whatever KERNEL_SANDBOX_RUNTIME says (CI registers runsc).
    require("runsc" in (docker_engine.api.info().get("Runtimes") or {}), "no runsc runtime")
    sb = await make_sandbox(image="kernel-sandbox:python", runtime="runsc")
    shell = await sb.run_shell("dmesg | head -1")
    assert "gVisor" in shell.stdout, shell
    assert (await sb.run_python("x = 6\nx * 7")).text == "42"
    assert docker_engine.api.inspect_container(sb.container_id)["HostConfig"]["Runtime"] == "runsc"


async def test_the_host_interrupts_a_running_cell_and_keeps_the_kernel(
    py_sandbox: AsyncSandbox,
) -> None:
    await py_sandbox.run_python("kept = 5")
    running = asyncio.ensure_future(
        py_sandbox.run_python("import time\nopen('started', 'w').close()\ntime.sleep(60)")
    )
    # the cell runs: SIGINT reaches it
    await await_for(lambda: py_sandbox.files.exists("started"), 30, what="the cell to start")
    await py_sandbox.host.interrupt()
    interrupted = await asyncio.wait_for(running, 30)
    assert interrupted.status == "error" and interrupted.error is not None
    assert interrupted.error.ename == "KeyboardInterrupt"
    assert (await py_sandbox.run_python("kept")).text == "5"
