"""The official mcp client over stdio and over streamable HTTP: tools, state, PNG, errors."""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import nbformat
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.serving import KEY_A, KEY_B, ROOT, Server

pytestmark = pytest.mark.integration

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
)
TOOLS = {"run_python", "run_shell", "read_file", "write_file", "list_files", "restart_kernel"}


async def _exercise(session: ClientSession, *, plot: bool) -> None:
    await session.initialize()
    assert {t.name for t in (await session.list_tools()).tools} == TOOLS
    first = await session.call_tool("run_python", {"code": "x = 40"})
    assert not first.is_error
    second = await session.call_tool("run_python", {"code": "x + 2"})
    assert not second.is_error and second.content[0].text == "42"  # type: ignore[union-attr]
    failed = await session.call_tool("run_python", {"code": "def f():\n    1/0\nf()"})
    assert failed.is_error
    text = failed.content[0].text  # type: ignore[union-attr]
    assert "ZeroDivisionError" in text and "Traceback" in text and "f()" in text
    assert text.count("division by zero") == 1  # the traceback once
    shell = await session.call_tool("run_shell", {"command": "echo hi > note.txt; cat note.txt"})
    assert not shell.is_error and "hi" in shell.content[0].text  # type: ignore[union-attr]
    assert (await session.call_tool("run_shell", {"command": "exit 4"})).is_error
    await session.call_tool("write_file", {"path": "a/b.txt", "content": "hello"})
    read = await session.call_tool("read_file", {"path": "a/b.txt"})
    assert read.content[0].text == "hello"  # type: ignore[union-attr]
    assert (await session.call_tool("read_file", {"path": "missing.txt"})).is_error
    if plot:
        drawn = await session.call_tool("run_python", {"code": PLOT})
        assert not drawn.is_error
        images = [c for c in drawn.content if c.type == "image"]
        assert images and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")


async def test_mcp_over_stdio_keeps_state_and_returns_images(docker_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    record = tmp_path / "mcp.ipynb"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernel_sandbox.cli.main", "mcp", "--record", str(record)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await _exercise(session, plot=True)
    nb = nbformat.read(record, as_version=4)
    nbformat.validate(nb)
    assert any(cell.source == "x = 40" for cell in nb.cells)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(f"t-mcp-{os.getpid()}", tmp_path_factory.mktemp("nb")).start()
    yield srv
    srv.stop()


async def test_mcp_over_streamable_http_a_sandbox_per_session(server: Server) -> None:
    headers = {"X-API-Key": KEY_A}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await _exercise(session, plot=False)
        async with httpx2.AsyncClient(headers=headers) as api:
            mine = (await api.get(f"{server.url}/v1/sandboxes")).json()
        assert len(mine) == 1  # this session's sandbox, owned by key A
        # an explicit sandbox id of the same key works; another key's does not
        sid = mine[0]["id"]
        same = await session.call_tool("run_python", {"code": "x", "sandbox_id": sid})
        assert same.content[0].text == "40"  # type: ignore[union-attr]
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY_B}"}, timeout=120) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as other,
    ):
        await other.initialize()
        refused = await other.call_tool("run_python", {"code": "x", "sandbox_id": sid})
        assert refused.is_error and "no sandbox" in refused.content[0].text  # type: ignore[union-attr]
    # the key as ?api_key= (the MCP Inspector's way) authorises tool calls too
    async with (
        httpx2.AsyncClient(timeout=120) as http,
        streamable_http_client(f"{server.url}/mcp?api_key={KEY_A}", http_client=http) as (
            read,
            write,
        ),
        ClientSession(read, write) as by_query,
    ):
        await by_query.initialize()
        mine_again = await by_query.call_tool("run_python", {"code": "x", "sandbox_id": sid})
        assert not mine_again.is_error and mine_again.content[0].text == "40"  # type: ignore[union-attr]
        wrong = f"{server.url}/mcp?api_key=not-a-key"
        assert (await http.post(wrong, json={})).status_code == 401
    async with httpx2.AsyncClient() as anonymous:
        assert (await anonymous.post(f"{server.url}/mcp", json={})).status_code == 401
    notebooks = list(server.record_dir.rglob(f"{sid}.ipynb"))
    assert notebooks
    nbformat.validate(nbformat.read(notebooks[0], as_version=4))
