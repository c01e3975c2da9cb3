"""pydantic-ai's own ``Agent`` drives ``kernel-sandbox mcp`` through its MCP client
(``MCPToolset`` over stdio): its real OpenAI model client against the local
OpenAI-compatible server, a real sandbox, a real notebook."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from kernel_sandbox.notebook.replay import areplay
from tests.conftest import TEST_LABEL
from tests.openai_server import ScriptedOpenAIServer, call, image_urls, text, tool_calls

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
