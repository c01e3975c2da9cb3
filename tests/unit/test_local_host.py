"""LocalKernelHost as a KernelHost: what any host must do, shown on the local one."""

from __future__ import annotations

import asyncio
import signal

import pytest

from kernel_sandbox import AsyncSandbox
from kernel_sandbox.backends.factory import available_hosts, host_class
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.testing import LocalKernelHost
from tests.unit.conftest import NewSandbox
from tests.waiting import await_for


def test_hosts_are_found_by_name() -> None:
    assert {"docker", "local"} <= set(available_hosts())
    assert host_class("local") is LocalKernelHost
    assert host_class("docker").name == "docker"
    with pytest.raises(ConfigError, match="no kernel host is named 'k9s'"):
        host_class("k9s")


async def test_an_interrupt_stops_the_cell_and_keeps_the_variables(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_python("kept = 5")
    marker = f"{sandbox.working_dir}/started"
    running = asyncio.ensure_future(
        sandbox.run_python(f"import time\nopen({marker!r}, 'w').close()\ntime.sleep(60)")
    )
    await await_for(lambda: sandbox.files.exists(marker), 60, 0.02, "the cell to start")
    await sandbox.host.interrupt()
    interrupted = await asyncio.wait_for(running, 30)
    assert interrupted.error is not None and interrupted.error.ename == "KeyboardInterrupt"
    assert (await sandbox.run_python("kept")).text == "5"


async def test_exec_feeds_stdin_and_bounds_the_output(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    fed = await sandbox.host.exec(["sh", "-c", "tr a-z A-Z"], stdin=b"quiet")
    assert (fed.exit_code, fed.stdout) == (0, b"QUIET")
    flood = await sandbox.host.exec(["sh", "-c", "yes | head -c 1000000"], max_output_bytes=1000)
    assert len(flood.stdout) < 1200 and flood.truncated_bytes > 990_000


async def test_a_killed_kernel_is_replaced_by_a_new_process(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_python("x = 1")
    before = sandbox.host.resource_id
    await sandbox.host.send_signal(signal.SIGKILL)
    died = await sandbox.run_python("x")
    assert died.status == "kernel_died" and died.state_lost
    assert sandbox.host.resource_id != before
    assert (await sandbox.run_python("1 + 1")).text == "2"


async def test_list_sandboxes_finds_live_ones_by_label(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox(labels={"suite": "local-host"})
    found = await LocalKernelHost.list_sandboxes({"suite": "local-host"})
    assert [(r.sandbox_id, r.running) for r in found] == [(sandbox.id, True)]
    await sandbox.close()
    assert await LocalKernelHost.list_sandboxes({"suite": "local-host"}) == []


async def test_an_idle_guest_does_not_hold_back_the_owners_calls(
    new_sandbox: NewSandbox,
) -> None:
    """Every client of a kernel gets its iopub, and the kernel waits for the slowest: a
    guest that queued its share unread (another server worker's copy of the sandbox
    between its calls) stalled the owner's calls after ~90 until one timed out and the
    kernel was restarted."""
    owner = await new_sandbox()
    guest = await AsyncSandbox.adopt(owner.id, owner.config, host="local", own=False)
    try:
        for n in range(300):  # the guest only connected (its probe's reads found messages)
            result = await owner.run_python(f"print({n})", timeout=20)
            assert (result.status, result.text) == ("ok", str(n)), n
        assert (await guest.run_python("kept = 1")).status == "ok"  # the guest still works
        for n in range(300):  # also once it has made a call
            result = await owner.run_python(f"print({n})", timeout=20)
            assert (result.status, result.text) == ("ok", str(n)), n
        assert (await guest.run_python("kept")).text == "1"
    finally:
        await guest.close()


async def test_an_idle_guest_stops_receiving_the_owners_output_until_its_next_call(
    new_sandbox: NewSandbox,
) -> None:
    """A guest between its calls (another worker's or replica's copy of the sandbox)
    received every message of every other client's call, only to drop it: it
    unsubscribes after a few of those calls, and its next call subscribes again and
    still gets all of its own output, first line included."""
    owner = await new_sandbox()
    guest = await AsyncSandbox.adopt(owner.id, owner.config, host="local", own=False)
    try:
        assert (await guest.run_python("kept = 1")).status == "ok"
        session = guest._kernel.session
        assert session is not None and "iopub" in session.channels.open
        for n in range(40):
            assert (await owner.run_python(f"print({n})", timeout=20)).text == str(n)
        await await_for(
            lambda: "iopub" not in session.channels.open, 10, 0.02, "the guest to unsubscribe"
        )
        again = await guest.run_python("print('first')\nkept + 1")
        assert [o.get("text") or o.get("data", {}).get("text/plain") for o in again.outputs] == [
            "first\n",
            "2",
        ]
        alone = await new_sandbox()  # a client without others keeps its subscription
        for _ in range(3):
            assert (await alone.run_python("1")).text == "1"
        assert "iopub" in alone._kernel.session.channels.open  # type: ignore[union-attr]
    finally:
        await guest.close()
