"""A restart through jupyter_client's own KernelManager keeps the client's way to the kernel.

The manager removes the ipc socket files of its connection info at a restart
(``cleanup_ipc_files``) and then calls the provisioner's ``cleanup(restart=True)``; its
clients' channels stay open (jupyter_server keeps a websocket's over a REST restart) and
reconnect by themselves.  With our provisioner those files are links to the sandbox's
sockets: they must be there again as soon as that cleanup returns, or an open iopub
reconnects too late and the first cell's output after the restart is lost.  The real
provisioner, found by its entry point, runs a real kernel here on ``LocalKernelHost``.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from jupyter_client import AsyncKernelClient, AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.jupyter import install_kernelspec


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[AsyncKernelManager]:
    """A started manager of our kernelspec on the local host, shut down afterwards."""
    where = install_kernelspec(
        "ks-restart", SandboxConfig(startup_timeout=120), prefix=str(tmp_path), host="local"
    )
    specs = KernelSpecManager(kernel_dirs=[str(where.parent)])
    km = AsyncKernelManager(kernel_name="ks-restart", kernel_spec_manager=specs)
    await km.start_kernel()
    try:
        yield km
    finally:
        await km.shutdown_kernel(now=True)


def _links(km: AsyncKernelManager) -> dict[int, str]:
    """Where each of the manager's ipc socket paths leads ('' for none)."""
    assert km.transport == "ipc"
    paths = {port: f"{km.ip}-{port}" for port in km.ports}
    return {port: os.readlink(p) if os.path.islink(p) else "" for port, p in paths.items()}


async def _output_comes_back(kc: AsyncKernelClient, deadline: float) -> bool:
    """Run a cell until its output comes on the client's iopub (the reconnect is libzmq's)."""
    while time.monotonic() < deadline:
        msg_id = kc.execute("print('back')")
        reply = await kc.get_shell_msg(timeout=deadline - time.monotonic())
        assert reply["parent_header"]["msg_id"] == msg_id
        while True:
            try:
                msg = await kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                return "back" in msg["content"]["text"]
    return False


async def test_links_are_back_when_the_restart_cleanup_returns(
    manager: AsyncKernelManager,
) -> None:
    before = _links(manager)
    assert all(before.values()), before
    kc = manager.client()
    kc.start_channels()  # opened before the restart, left open across it
    try:
        await kc.wait_for_ready(timeout=60)
        # jupyter_client's restart is this shutdown, then a start with the same ports
        await manager.shutdown_kernel(restart=True)
        assert _links(manager) == before
        await manager.start_kernel()
        assert _links(manager) == before
        assert await _output_comes_back(kc, time.monotonic() + 60)
    finally:
        kc.stop_channels()


async def test_a_full_restart_keeps_the_links(manager: AsyncKernelManager) -> None:
    before = _links(manager)
    await manager.restart_kernel()
    assert _links(manager) == before
    await manager.shutdown_kernel()
    assert not any(os.path.lexists(f"{manager.ip}-{port}") for port in manager.ports)
