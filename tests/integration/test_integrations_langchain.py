"""LangChain's own agent runner (``create_agent``) drives our tools: the real
``langchain-openai`` model client against the local OpenAI-compatible server, a real
sandbox, a real notebook."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_openai import ChatOpenAI

from kernel_sandbox import AsyncSandbox, Sandbox
from kernel_sandbox.integrations.langchain import sandbox_tools
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.notebook.replay import areplay
from kernel_sandbox.tools import ToolResult
from tests.conftest import TEST_LABEL
from tests.openai_server import RecordedRequest, ScriptedOpenAIServer, call, text, tool_calls

pytestmark = pytest.mark.integration

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
)


def _model(server: ScriptedOpenAIServer) -> ChatOpenAI:
    return ChatOpenAI(model="scripted", base_url=server.base_url, api_key="test", max_retries=0)


def _sent(request: RecordedRequest) -> list[tuple[dict[str, Any], list[str]]]:
    """Each tool result the model was sent: its JSON, and the image URLs beside it."""
    out = []
    for message in request.tool_messages:
        content = message["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        body = json.loads("".join(p["text"] for p in parts if p["type"] == "text"))
        images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        out.append((body, images))
    return out


async def test_create_agent_keeps_state_sees_plots_errors_and_files(
    make_sandbox: Any, tmp_path: Path
) -> None:
    sandbox: AsyncSandbox = await make_sandbox()
    recorder = NotebookRecorder.attach(sandbox, tmp_path / "session.ipynb", title="LangChain")
    script = [
        tool_calls(call("python_executor", {"code": "x = 21"})),
        tool_calls(call("python_executor", {"code": "x * 2"})),
        tool_calls(call("python_executor", {"code": PLOT})),
        tool_calls(call("python_executor", {"code": "1/0"})),
        tool_calls(
            call("file_operation", {"operation": "write", "file_path": "note.txt", "content": "hi"})
        ),
        tool_calls(call("shell_executor", {"command": "cat note.txt"})),
        text("x * 2 is 42"),
    ]
    with ScriptedOpenAIServer(script) as server:
        agent = create_agent(_model(server), tools=sandbox_tools(sandbox))
        state = await agent.ainvoke({"messages": [("user", "What is x * 2?")]})
        requests = server.chat_requests
    recorder.finish()

    assert state["messages"][-1].content == "x * 2 is 42"
    offered = {t["function"]["name"] for t in requests[0].tools}
    assert offered == {"python_executor", "shell_executor", "file_operation"}
    sent = _sent(requests[-1])
    assert sent[1][0]["output"] == "42"
    plot, images = sent[2]
    assert len(images) == 1 and images[0].startswith("data:image/png;base64,iVBOR"), plot
    assert plot["artifacts"][0]["mime_type"] == "image/png"
    error = sent[3][0]
    assert error["status"] == "error" and "ZeroDivisionError" in error["output"]
    assert sent[5][0]["output"] == "hi"
    replies = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    # langchain-core's mark of a failed call, for LangGraph and LangSmith; the rest succeed
    assert [m.status for m in replies] == ["success"] * 3 + ["error"] + ["success"] * 2
    assert "ZeroDivisionError" in replies[3].text
    artifacts = [m.artifact for m in replies]
    assert all(isinstance(a, ToolResult) for a in artifacts)  # the program keeps everything
    assert artifacts[2].images()[0].startswith(b"\x89PNG")

    notebook = tmp_path / "session.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    assert sources[1:3] == ["x = 21", "x * 2"]
    report = await areplay(
        notebook, output=tmp_path / "replayed.ipynb", sandbox_options={"labels": TEST_LABEL}
    )
    assert report.cells_by_index[sources.index("x * 2")].verdict == "same"


def test_a_blocking_sandbox_serves_the_synchronous_runner(docker_engine: object) -> None:
    script = [
        tool_calls(call("python_executor", {"code": "x = 21"})),
        tool_calls(call("python_executor", {"code": "x * 2"})),
        text("42"),
    ]
    with Sandbox.create(labels=TEST_LABEL) as sandbox, ScriptedOpenAIServer(script) as server:
        tools = sandbox_tools(sandbox, {"python_executor": {}})
        state = create_agent(_model(server), tools=tools).invoke(
            {"messages": [("user", "What is x * 2?")]}
        )
        requests = server.chat_requests
    assert state["messages"][-1].content == "42"
    assert [t["function"]["name"] for t in requests[0].tools] == ["python_executor"]
    assert _sent(requests[-1])[1][0]["output"] == "42"


async def test_a_failed_call_is_an_error_tool_message_that_keeps_its_result(
    make_sandbox: Any,
) -> None:
    """What a graph's ToolNode gets for a failing command and for bad arguments."""
    tools = {t.name: t for t in sandbox_tools(await make_sandbox())}
    shell = tools["shell_executor"]
    failed = await shell.ainvoke(
        {"type": "tool_call", "id": "c1", "name": shell.name, "args": {"command": "exit 3"}}
    )
    assert isinstance(failed, ToolMessage) and failed.status == "error"
    assert failed.artifact.metadata["exit_code"] == 3
    bad = await tools["python_executor"].ainvoke(
        {"type": "tool_call", "id": "c2", "name": "python_executor", "args": {"code": 5}}
    )
    assert bad.status == "error" and bad.artifact.status == "error"
    fine = await shell.ainvoke(
        {"type": "tool_call", "id": "c3", "name": shell.name, "args": {"command": "true"}}
    )
    assert fine.status == "success" and fine.artifact.ok


async def test_an_async_sandbox_refuses_the_synchronous_call_with_a_reason(
    make_sandbox: Any,
) -> None:
    (tool,) = sandbox_tools(await make_sandbox(), {"python_executor": {}})
    with pytest.raises(TypeError, match="ainvoke"):
        tool.invoke({"code": "1"})
