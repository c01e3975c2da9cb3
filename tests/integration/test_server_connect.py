"""``client.aconnect`` / ``client.connect``: the remote client, async and blocking; and
``interrupt`` through the server on the sandbox layer's own call."""

from __future__ import annotations

import asyncio
import os

import pytest

from kernel_sandbox import client
from kernel_sandbox.client.remote import RemoteSandbox
from kernel_sandbox.errors import ConfigError, SandboxNotFoundError
from tests.integration.serving import KEY_A, KEY_B, Server
from tests.waiting import await_for

pytestmark = pytest.mark.integration


async def test_connect_returns_the_remote_client(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = Server(f"t-connect-{os.getpid()}", tmp_path).start()
    try:
        sb = await client.aconnect(server.url, api_key=KEY_A)
        assert isinstance(sb, RemoteSandbox)
        await sb.run_python("kept = 5")
        again = await client.aconnect(server.url, sb.id, api_key=KEY_A)
        assert (await again.run_python("kept")).text == "5"
        with pytest.raises(SandboxNotFoundError):
            await client.aconnect(server.url, sb.id, api_key=KEY_B)  # not B's
        code = "import time\nopen('started', 'w').close()\nwhile True: time.sleep(0.1)"
        cell = asyncio.ensure_future(sb.run_python(code, timeout=120))
        await await_for(lambda: again.files.exists("started"), 60, 0.2, what="the cell to start")
        await again.interrupt()  # POST /interrupt -> AsyncSandbox.interrupt on the server
        result = await cell
        assert result.error is not None and result.error.ename == "KeyboardInterrupt"
        assert (await sb.run_python("kept")).text == "5"
        await again.close()
        await sb.close()

        blocking = await asyncio.to_thread(client.connect, server.url, api_key=KEY_A)
        assert (await asyncio.to_thread(blocking.run_python, "6 * 7")).text == "42"
        with pytest.raises(ConfigError, match="only on a local sandbox"):
            _ = blocking.labels  # not an AttributeError deep inside
        await asyncio.to_thread(blocking.close)
    finally:
        server.stop()
