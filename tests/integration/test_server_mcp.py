"""The official mcp client over stdio and over streamable HTTP: tools, state, PNG, errors."""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import nbformat
import pytest
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from kernel_sandbox.backends.docker import docker_client
from kernel_sandbox.backends.docker.images import builder
from tests.conftest import require
from tests.integration.serving import KEY_A, KEY_B, ROOT, Server
from tests.waiting import await_for

pytestmark = pytest.mark.integration

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
)
TOOLS = {"run_python", "run_shell", "read_file", "write_file", "list_files", "restart_kernel"}
TOOLS |= {"run_code", "create_context", "list_contexts", "restart_context", "remove_context"}
POLYGLOT = "kernel-sandbox:polyglot"


async def _exercise(session: ClientSession, *, plot: bool) -> None:
    await session.initialize()
    assert {t.name for t in (await session.list_tools()).tools} >= TOOLS
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
    params = _stdio(record)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await _exercise(session, plot=True)
    nb = nbformat.read(record, as_version=4)
    nbformat.validate(nb)
    assert any(cell.source == "x = 40" for cell in nb.cells)


def _stdio(record: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernel_sandbox.cli.main", "mcp", "--record", str(record), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )


async def test_mcp_run_code_in_every_language_of_a_polyglot_image(
    docker_engine: Any, tmp_path: Path
) -> None:
    require(builder.image_exists(docker_client(), POLYGLOT) is not None, f"{POLYGLOT} not built")
    params = _stdio(tmp_path / "mcp.ipynb", "--image", POLYGLOT, "--timeout", "120")
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        language = tools["run_code"].input_schema["properties"]["language"]
        assert language["anyOf"][0]["enum"] == ["bash", "javascript", "python", "r"]
        assert "ggplot2" in (tools["run_code"].description or "")
        # R: state kept across calls, an error is an error result with R's message
        assert not (
            await session.call_tool("run_code", {"code": "x <- 41", "language": "r"})
        ).is_error
        shown = await session.call_tool("run_code", {"code": "x + 1", "language": "r"})
        assert not shown.is_error and "42" in _text(shown), _text(shown)
        failed = await session.call_tool(
            "run_code", {"code": 'f <- function() stop("boom"); f()', "language": "r"}
        )
        assert failed.is_error and "boom" in _text(failed)
        # a JavaScript context of its own: its state, the sandbox's files
        await session.call_tool("write_file", {"path": "note.txt", "content": "shared"})
        made = await session.call_tool("create_context", {"language": "javascript"})
        assert not made.is_error, _text(made)
        js = made.structured_content["context_id"]
        await session.call_tool("run_code", {"code": "var y = 20", "context": js})
        both = await session.call_tool(
            "run_code", {"code": "Deno.readTextFileSync('note.txt') + (y + 1)", "context": js}
        )
        assert not both.is_error and "shared21" in _text(both), _text(both)
        thrown = await session.call_tool(
            "run_code", {"code": "throw new Error('js boom')", "context": js}
        )
        assert thrown.is_error and "js boom" in _text(thrown)
        listed = _text(await session.call_tool("list_contexts", {}))
        assert js in listed and "r (kernel ir)" in listed and "default  python" in listed
        # the python kernel is run_python's, untouched by the others
        assert _text(await session.call_tool("run_python", {"code": "'x' in dir()"})) == "False"
        wrong = await session.call_tool("run_code", {"code": "1", "language": "cobol"})
        assert wrong.is_error and "javascript" in _text(wrong)  # the languages it has
        assert not (await session.call_tool("remove_context", {"context_id": js})).is_error
        gone = await session.call_tool("run_code", {"code": "y", "context": js})
        assert gone.is_error and "no context" in _text(gone)
        assert "42" in _text(
            await session.call_tool("run_code", {"code": "x + 1", "language": "r"})
        )
    nb = nbformat.read(tmp_path / "mcp.ipynb", as_version=4)
    assert any(cell.source == "x <- 41" for cell in nb.cells)


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


@pytest.fixture(scope="module")
def reaping_server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    """A server that removes sandboxes idle for 8 s."""
    srv = Server(
        f"t-mcp-idle-{os.getpid()}", tmp_path_factory.mktemp("nb"), ["--idle-timeout", "8"]
    ).start()
    yield srv
    srv.stop()


async def _sandbox_ids(server: Server, key: str = KEY_A) -> list[str]:
    async with httpx2.AsyncClient(headers={"X-API-Key": key}) as api:
        return [s["id"] for s in (await api.get(f"{server.url}/v1/sandboxes")).json()]


def _text(result: Any) -> str:
    return str(result.content[0].text)


async def test_mcp_without_sessions_keeps_state_per_key_and_by_sandbox_id(
    reaping_server: Server,
) -> None:
    """Protocol 2026-07-28 (the official client's default): no session, state kept."""
    server = reaping_server
    async with (
        httpx2.AsyncClient(headers={"X-API-Key": KEY_A}, timeout=120) as http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as client,
    ):
        assert client.protocol_version == "2026-07-28"  # session-less, every call on its own
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == TOOLS | {"create_sandbox", "close_sandbox"}
        for code in ["x = 1", "x += 1", "x += 1", "x += 1", "x * 10"]:  # five calls
            result = await client.call_tool("run_python", {"code": code})
            assert not result.is_error, _text(result)
        assert _text(result) == "40"
        (default,) = await _sandbox_ids(server)  # five calls, one sandbox: the key's

        made = await client.call_tool("create_sandbox", {})
        mine = made.structured_content["sandbox_id"]  # type: ignore[index]
        assert _text(made) == mine and mine != default
        await client.call_tool("run_python", {"code": "y = 'own'", "sandbox_id": mine})
        own = await client.call_tool("run_python", {"code": "y", "sandbox_id": mine})
        assert _text(own) == "'own'"
        other = await client.call_tool("run_python", {"code": "y"})  # the key's sandbox
        assert other.is_error and "NameError" in _text(other)
        assert sorted(await _sandbox_ids(server)) == sorted([default, mine])

    async with (
        httpx2.AsyncClient(headers={"X-API-Key": KEY_B}, timeout=120) as http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as intruder,
    ):
        for tool, args in [("close_sandbox", {}), ("run_python", {"code": "y"})]:
            refused = await intruder.call_tool(tool, {**args, "sandbox_id": mine})
            assert refused.is_error and "no sandbox" in _text(refused)

    async with (
        httpx2.AsyncClient(headers={"X-API-Key": KEY_A}, timeout=120) as http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as client,
    ):
        closed = await client.call_tool("close_sandbox", {"sandbox_id": mine})
        assert not closed.is_error
        assert await _sandbox_ids(server) == [default]

        # idle: the server's reaper removes the key's sandbox; the next call starts anew
        async def reaped() -> bool:
            return await _sandbox_ids(server) == []

        await await_for(reaped, 60, 0.5, what="the reaper to remove the key's sandbox")
        again = await client.call_tool("run_python", {"code": "x"})
        assert again.is_error and "NameError" in _text(again)
