"""Adoption: a sandbox whose owner was SIGKILLed is taken over with its kernel as it was.

Also the guest (``own=False``) beside a live owner, and the public ``interrupt``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.errors import KernelError, SandboxNotFoundError
from kernel_sandbox.sandbox import AsyncSandbox
from tests.integration.conftest import orphan_of_killed_owner
from tests.waiting import await_for

pytestmark = pytest.mark.usefixtures("docker_engine")

#: Opens a sandbox on ``transport``, sets a variable, prints the id, waits to be killed.
OWNER = """
import sys
from kernel_sandbox.sync import Sandbox
sb = Sandbox.create(image="kernel-sandbox:python", transport=sys.argv[1],
                    labels={"kernel-sandbox.test": "1"})
sb.run_python("secret = 41; import os; pid = os.getpid()")
sb.files.write("kept.txt", "files too")
print(sb.id, flush=True)
sys.stdin.read()
"""


def _owner(transport: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, transport],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.mark.orphans  # a killed owner, then adopted
@pytest.mark.parametrize("transport", ["ipc", pytest.param("tcp", marks=pytest.mark.tcp_transport)])
async def test_adopted_after_owner_sigkill_keeps_variables(transport: str) -> None:
    program = OWNER.replace("sys.argv[1]", repr(transport))
    sandbox_id = await asyncio.to_thread(orphan_of_killed_owner, program)
    orphan = f"sandbox {sandbox_id}"
    assert orphan in await _gc_finds()  # its owner is gone
    sb = await AsyncSandbox.adopt(sandbox_id)
    try:
        assert sb.config.transport == transport
        # held now: gc keeps it and its volumes (ipc: the run directory's claim; tcp: an
        # adoption claim, the labels still name the dead owner); a second owner is refused
        assert [found for found in await _gc_finds() if sandbox_id in found] == []
        with pytest.raises(KernelError, match="held by a live process"):
            await AsyncSandbox.adopt(sandbox_id)
        result = await sb.run_python("secret += 1; secret")
        assert result.status == "ok" and result.text == "42"  # same kernel, not a new one
        assert await sb.files.read_text("kept.txt") == "files too"
        # the adopter may restart it (a new kernel, files kept)
        await sb.restart()
        assert (await sb.run_python("'secret' in dir()")).text == "False"
        assert await sb.files.read_text("kept.txt") == "files too"
    finally:
        await sb.close()
    rows = await DockerHost.list_sandboxes({"kernel-sandbox.id": sandbox_id})
    assert rows == []  # the adopter owns it: close removed it


async def _gc_finds() -> list[str]:
    """What ``kernel-sandbox gc`` would remove now (nothing is removed)."""
    return [leftover.what for leftover in await DockerHost.gc()]


@pytest.mark.orphans  # a killed owner, then adopted
async def test_guest_beside_a_live_owner_touches_nothing() -> None:
    proc, sandbox_id = await asyncio.to_thread(_owner, "ipc")
    try:
        with pytest.raises(KernelError, match="held by a live process"):
            await AsyncSandbox.adopt(sandbox_id)  # two owners would fight over it
        guest = await AsyncSandbox.adopt(sandbox_id, own=False)
        assert (await guest.run_python("secret")).text == "41"
        with pytest.raises(KernelError, match="guest"):
            await guest.restart()
        await guest.close()
        rows = await DockerHost.list_sandboxes({"kernel-sandbox.id": sandbox_id})
        assert [r.running for r in rows] == [True]  # the guest left it running
    finally:
        proc.kill()
        await asyncio.to_thread(proc.wait)
    sb = await AsyncSandbox.adopt(sandbox_id)  # the owner is gone now: take it, remove it
    await sb.close()


async def test_adopt_unknown_sandbox() -> None:
    with pytest.raises(SandboxNotFoundError):
        await AsyncSandbox.adopt("000000000000")


async def test_interrupt_stops_a_cell_and_keeps_variables(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb = await make_sandbox(image="kernel-sandbox:python")
    await sb.run_python("kept = 7")
    code = "import time\nopen('started', 'w').close()\nwhile True: time.sleep(0.1)"
    cell = asyncio.create_task(sb.run_python(code, timeout=120))

    async def started() -> bool:
        return cell.done() or await sb.files.exists("started")

    await await_for(started, 60, 0.2, what="the cell to start")
    await sb.interrupt()
    result = await cell
    assert result.status == "error" and result.error is not None
    assert result.error.ename == "KeyboardInterrupt"
    assert (await sb.run_python("kept")).text == "7"
