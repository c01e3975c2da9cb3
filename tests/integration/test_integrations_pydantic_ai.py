"""pydantic-ai's own ``Agent`` drives our MCP servers through its MCP client
(``MCPToolset``): ``kernel-sandbox mcp`` over stdio and ``kernel-sandbox serve``'s ``/mcp``
over streamable HTTP; its real OpenAI model client against the local OpenAI-compatible
server, real sandboxes, real notebooks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import nbformat
import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from kernel_sandbox.notebook.replay import areplay
from tests.conftest import TEST_LABEL
from tests.integration.serving import KEY_A, Server
from tests.openai_server import (
    RecordedRequest,
    ScriptedOpenAIServer,
    call,
    image_urls,
    text,
    tool_calls,
)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
)


def _texts(messages: list[dict[str, Any]]) -> str:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append(str(content or ""))
    return "\n".join(out)


async def test_agent_over_mcp_stdio_keeps_state_sees_plots_errors_and_files(
    docker_engine: object, tmp_path: Path
) -> None:
    record = tmp_path / "session.ipynb"
    sandbox = MCPToolset(
        StdioTransport(
            sys.executable,  # `kernel-sandbox mcp`, from this checkout
            ["-m", "kernel_sandbox.cli.main", "mcp", "--record", str(record)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=str(ROOT),
        ),
        init_timeout=120,  # the server process imports the package first; slow on a busy host
    )
    script = [
        tool_calls(call("run_python", {"code": "x = 21"})),
        tool_calls(call("run_python", {"code": "x * 2"})),
        tool_calls(call("run_python", {"code": PLOT})),
        tool_calls(call("run_python", {"code": "1/0"})),
        tool_calls(call("write_file", {"path": "note.txt", "content": "written-over-mcp"})),
        tool_calls(call("run_python", {"code": "print(open('note.txt').read())"})),
        text("x * 2 is 42"),
    ]
    with ScriptedOpenAIServer(script) as server:
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        agent = Agent(OpenAIChatModel("scripted", provider=provider), toolsets=[sandbox])
        async with agent:
            result = await agent.run("What is x * 2?")
        requests = server.chat_requests

    assert result.output == "x * 2 is 42"
    offered = {t["function"]["name"] for t in requests[0].tools}
    assert {"run_python", "run_shell", "read_file", "write_file"} <= offered
    assert "42" in _texts(requests[2].tool_messages)
    after_plot = requests[3].messages
    assert [u[:30] for u in image_urls(after_plot)] == ["data:image/png;base64,iVBORw0K"]
    assert "ZeroDivisionError" in _texts(requests[4].messages[-1:])  # the retry prompt
    assert "written-over-mcp" in _texts(requests[6].messages[-1:])

    nb = nbformat.read(record, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    first = sources.index("x = 21")
    assert sources[first : first + 2] == ["x = 21", "x * 2"]
    report = await areplay(
        record, output=tmp_path / "replayed.ipynb", sandbox_options={"labels": TEST_LABEL}
    )
    assert report.cells_by_index[first + 1].verdict == "same"
    assert result.usage.requests == len(requests)


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory, docker_engine: object) -> Iterator[Server]:
    # the image with matplotlib (the server tests default to the small one)
    image = ["--image", "kernel-sandbox:datascience"]
    srv = Server(f"t-pydantic-ai-{os.getpid()}", tmp_path_factory.mktemp("nb"), image).start()
    yield srv
    srv.stop()


async def _sandbox_ids(server: Server) -> list[str]:
    async with httpx2.AsyncClient(headers={"X-API-Key": KEY_A}) as api:
        return [s["id"] for s in (await api.get(f"{server.url}/v1/sandboxes")).json()]


def _made(request: RecordedRequest) -> str:
    """The sandbox id create_sandbox returned, from the model's last tool message
    (pydantic-ai sends its structured content, ``{"sandbox_id": ...}``)."""
    return str(json.loads(_texts(request.tool_messages[-1:]))["sandbox_id"])


async def test_agent_over_streamable_http_mcp_keeps_state_across_calls_and_runs(
    mcp_server: Server, tmp_path: Path
) -> None:
    """pydantic-ai's MCP client on `kernel-sandbox serve`'s /mcp (streamable HTTP, the
    protocol without sessions): its calls share the key's sandbox, within a run and
    across runs; a sandbox of its own from create_sandbox keeps its state by id."""
    script = [
        tool_calls(call("run_python", {"code": "x = 21"})),
        tool_calls(call("run_python", {"code": "x * 2"})),
        tool_calls(call("run_python", {"code": PLOT})),
        tool_calls(call("run_python", {"code": "1/0"})),
        tool_calls(call("write_file", {"path": "note.txt", "content": "written-over-http"})),
        tool_calls(call("run_python", {"code": "print(open('note.txt').read())"})),
        text("x * 2 is 42"),
        # a second run, a new connection: the key's sandbox still holds x
        tool_calls(call("run_python", {"code": "x + 1"})),
        text("22"),
        # a third: a sandbox of its own, named by id across calls
        tool_calls(call("create_sandbox", {})),
        lambda r: tool_calls(call("run_python", {"code": "y = 5", "sandbox_id": own(r)})),
        lambda r: tool_calls(
            call("run_python", {"code": "y * x if 'x' in dir() else y", "sandbox_id": sid[0]})
        ),
        text("5"),
    ]
    sid: list[str] = []

    def own(request: RecordedRequest) -> str:
        sid.append(_made(request))
        return sid[0]

    def toolset() -> MCPToolset[None]:
        return MCPToolset(f"{mcp_server.url}/mcp", headers={"X-API-Key": KEY_A}, init_timeout=120)

    with ScriptedOpenAIServer(script) as server:
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        model = OpenAIChatModel("scripted", provider=provider)
        sandbox = toolset()
        agent = Agent(model, toolsets=[sandbox])
        async with agent:
            first = await agent.run("What is x * 2?")
        requests = server.chat_requests
        assert first.output == "x * 2 is 42"
        offered = {t["function"]["name"] for t in requests[0].tools}
        assert {"run_python", "write_file", "create_sandbox", "close_sandbox"} <= offered
        assert "42" in _texts(requests[2].tool_messages)
        assert [u[:30] for u in image_urls(requests[3].messages)] == [
            "data:image/png;base64,iVBORw0K"
        ]
        assert "ZeroDivisionError" in _texts(requests[4].messages[-1:])  # the retry prompt
        assert "written-over-http" in _texts(requests[6].messages[-1:])
        (key_sandbox,) = await _sandbox_ids(mcp_server)  # six calls, one sandbox

        again = Agent(model, toolsets=[toolset()])
        async with again:
            second = await again.run("And x + 1?")
        assert second.output == "22"
        assert "22" in _texts(server.chat_requests[-1].tool_messages)

        async with again:
            third = await again.run("Make a sandbox of your own and set y = 5 there")
        assert third.output == "5"
        assert sid[0] != key_sandbox
        assert _texts(server.chat_requests[-1].tool_messages[-1:]).strip() == "5"  # no x there
        assert sorted(await _sandbox_ids(mcp_server)) == sorted([key_sandbox, sid[0]])

    (notebook,) = mcp_server.record_dir.rglob(f"{key_sandbox}.ipynb")
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    first_cell = sources.index("x = 21")
    assert sources[first_cell : first_cell + 2] == ["x = 21", "x * 2"]
    assert "x + 1" in sources
    report = await areplay(
        notebook, output=tmp_path / "replayed.ipynb", sandbox_options={"labels": TEST_LABEL}
    )
    assert report.cells_by_index[first_cell + 1].verdict == "same"
