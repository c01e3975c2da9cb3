"""The agent loop against the local scripted OpenAI server, on a real local sandbox.

The real openai client talks HTTP to ``tests/openai_server.py``; the sandbox is the real
AsyncSandbox on LocalKernelHost (a local ipykernel running the scripted, trusted code),
so retries, budgets, malformed calls, events and recording are tested without a Docker
engine.  The same behaviours against Docker sandboxes are in
``tests/integration/test_agent.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import nbformat
import pytest

from kernel_sandbox.agent import (
    Agent,
    Budget,
    ModelRetrying,
    RetryPolicy,
    SessionEnded,
    ToolCallFinished,
)
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.notebook import META_KEY
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.testing import LocalKernelHost
from tests.openai_server import ScriptedOpenAIServer, call, error, text, tool_calls
from tests.unit.conftest import NewSandbox

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 3000).decode()
FAST = RetryPolicy(max_retries=3, initial_delay=0.01, max_delay=0.05)


#: Defines ``show_png()`` in the kernel: it displays PNG, as a plot would.
SHOW_PNG = (
    "from IPython.display import display\n"
    f"def show_png():\n    display({{'image/png': {PNG!r}}}, raw=True)"
)


@pytest.fixture
async def sandbox(new_sandbox: NewSandbox) -> AsyncSandbox:
    return await new_sandbox()


def py(code: str, **kw) -> dict:
    return call("python_executor", {"code": code, "timeout": None}, **kw)


def make_agent(
    server: ScriptedOpenAIServer, tmp_path, sandbox: AsyncSandbox, **kw
) -> tuple[Agent, AsyncSandbox]:
    kw.setdefault("retry", FAST)
    kw.setdefault("tools_config", {"python_executor": {}})
    agent = Agent(
        base_url=server.base_url,
        model="scripted",
        sandbox=sandbox,
        notebook_dir=tmp_path / "sessions",
        **kw,
    )
    return agent, sandbox


def read(path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


async def test_state_and_results_flow_back_to_the_model(tmp_path, sandbox):
    with ScriptedOpenAIServer(
        [
            tool_calls(py("x = 6 * 7", id="c1")),
            tool_calls(py("print(x)", id="c2")),
            lambda req: text(f"x is {req.tool_results()[-1]['output']}"),
        ]
    ) as server:
        agent, sandbox = make_agent(server, tmp_path, sandbox)
        result = await agent.arun("compute x")
        assert result.status == "completed" and result.answer == "x is 42"
        assert (result.turns, result.tool_calls) == (3, 2)
        third = server.chat_requests[2]
        assert [m["role"] for m in third.messages] == [
            "system", "user", "assistant", "tool", "assistant", "tool"
        ]  # fmt: skip
        assert [m["tool_call_id"] for m in third.tool_messages] == ["c1", "c2"]
        assert third.tools and {t["function"]["name"] for t in third.tools} == {"python_executor"}
        assert not sandbox.closed  # borrowed sandboxes are left running
        nb = read(result.notebook_path)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert [c.source for c in code] == ["x = 6 * 7", "print(x)"]
        assert [c.metadata[META_KEY]["tool_call_id"] for c in code] == ["c1", "c2"]
        assert code[1].metadata[META_KEY]["tool_status"] == "success"
        assert code[1].metadata[META_KEY]["model"] == "scripted"
        assert nb.metadata[META_KEY]["status"] == "completed"
        assert nb.metadata[META_KEY]["model"] == "scripted"


async def test_rate_limit_and_server_errors_are_retried_then_succeed(tmp_path, sandbox):
    retries: list[ModelRetrying] = []
    with ScriptedOpenAIServer([error(429, "slow down"), error(503), text("fine")]) as server:
        agent, _ = make_agent(server, tmp_path, sandbox, listeners=[retries.append])
        result = await agent.arun("hi")
    assert result.status == "completed" and result.answer == "fine"
    assert len(server.chat_requests) == 3
    retries = [e for e in retries if isinstance(e, ModelRetrying)]
    assert [r.attempt for r in retries] == [1, 2]
    assert "HTTP 429: slow down" in retries[0].error and "HTTP 503" in retries[1].error


async def test_exhausted_retries_are_reported_and_the_session_stays_usable(tmp_path, sandbox):
    policy = RetryPolicy(max_retries=2, initial_delay=0.01)
    with ScriptedOpenAIServer([error(500, "overloaded")] * 3) as server:
        agent, _ = make_agent(server, tmp_path, sandbox, retry=policy)
        async with agent.session() as session:
            failed = await session.send("first")
            assert failed.status == "error" and not failed.ok
            assert "after 3 attempts" in failed.reason and "HTTP 500: overloaded" in failed.reason
            nb = read(failed.notebook_path)
            assert nb.metadata[META_KEY]["status"] == "failed"
            assert "Model API error" in nb.cells[-1].source
            server.add(text("second time lucky"))
            ok = await session.send("again")
            assert ok.status == "completed" and ok.answer == "second time lucky"
            assert ok.notebook_path == failed.notebook_path
        nb = read(ok.notebook_path)
        assert nb.metadata[META_KEY]["status"] == "completed"
        users = [c.source for c in nb.cells if c.metadata[META_KEY].get("role") == "user"]
        assert users == ["**User**\n\nfirst", "**User**\n\nagain"]


async def test_errors_that_retrying_cannot_fix_are_not_retried(tmp_path, sandbox):
    with ScriptedOpenAIServer([error(400, "model does not support tools", type="x")]) as server:
        agent, _ = make_agent(server, tmp_path, sandbox)
        result = await agent.arun("hi")
    assert result.status == "error" and "after 1 attempt:" in result.reason
    assert "does not support tools" in result.reason and len(server.chat_requests) == 1


async def test_an_unreachable_endpoint_is_an_error_result_not_an_exception(tmp_path, sandbox):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = Agent(
        base_url=f"http://127.0.0.1:{port}/v1",
        sandbox=sandbox,
        retry=RetryPolicy(max_retries=1, initial_delay=0.01),
        notebook_dir=tmp_path,
    )
    result = await agent.arun("hi")
    assert result.status == "error" and "cannot connect" in result.reason
    read(result.notebook_path)


async def test_malformed_tool_calls_come_back_as_errors_the_model_can_fix(tmp_path, sandbox):
    nameless = {"id": None, "type": "function", "function": {"name": None, "arguments": None}}
    with ScriptedOpenAIServer(
        [
            tool_calls(
                call("no_such_tool", {}, id="u"),
                call("python_executor", "{not json", id="j"),
                call("python_executor", {"timeout": 3}, id="m"),
                call("python_executor", {"code": "1", "colour": "red"}, id="e"),
                nameless,
                py("1/0", id="z"),
            ),
            text("understood"),
        ]
    ) as server:
        agent, _ = make_agent(server, tmp_path, sandbox)
        result = await agent.arun("go")
        assert result.status == "completed" and result.tool_calls == 6
        second = server.chat_requests[1]
        asked = [tc["id"] for tc in second.messages[2]["tool_calls"]]
        answered = [m["tool_call_id"] for m in second.tool_messages]
        assert answered == asked and len(set(asked)) == 6  # every call answered, ids unique
        errors = [r["error"] for r in second.tool_results()]
        assert "unknown tool 'no_such_tool'" in errors[0] and "python_executor" in errors[0]
        assert "not valid JSON" in errors[1]
        assert "missing required argument 'code'" in errors[2]
        assert "unexpected argument 'colour'" in errors[3]
        assert "unknown tool" in errors[4]
        assert "ZeroDivisionError" in errors[5]
    nb = read(result.notebook_path)
    notes = [c.source for c in nb.cells if c.metadata[META_KEY].get("kind") == "note"]
    assert sum("was not executed" in n for n in notes) == 5
    failing = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in failing] == ["1/0"]
    assert failing[0].outputs[-1]["ename"] == "ZeroDivisionError"


async def test_turn_budget_ends_a_task_that_never_answers(tmp_path, sandbox):
    ended: list = []
    with ScriptedOpenAIServer([lambda req: tool_calls(py("pass"))] * 5) as server:
        agent, _ = make_agent(
            server, tmp_path, sandbox, budget=Budget(max_turns=2), listeners=[ended.append]
        )
        result = await agent.arun("loop forever")
    assert result.status == "budget_exhausted" and result.budget == "turns"
    assert "turn budget" in result.answer and "max_turns=2" in result.answer
    assert len(server.chat_requests) == 2 and result.tool_calls == 2
    assert isinstance(ended[-1], SessionEnded) and ended[-1].status == "budget_exhausted"
    nb = read(result.notebook_path)
    assert nb.metadata[META_KEY]["status"] == "budget_exhausted"
    assert "Stopped" in nb.cells[-1].source


async def test_token_budget_counts_usage_reported_by_the_endpoint(tmp_path, sandbox):
    usage = {"prompt_tokens": 500, "completion_tokens": 100, "total_tokens": 600}
    with ScriptedOpenAIServer(
        [
            tool_calls(py("a = 1"), content="Starting.", usage=usage),
            tool_calls(py("b = 2"), content="Still going.", usage=usage),
            text("never reached"),
        ]
    ) as server:
        agent, _ = make_agent(
            server, tmp_path, sandbox, budget=Budget(max_turns=None, max_tokens=1000)
        )
        result = await agent.arun("count tokens")
    assert result.status == "budget_exhausted" and result.budget == "tokens"
    assert result.usage.total_tokens == 1200 and len(server.chat_requests) == 2
    assert result.answer.startswith("Still going.")  # the model's last words are kept
    assert "token budget" in result.answer


async def test_time_budget_cuts_a_model_call_short(tmp_path, sandbox):
    with ScriptedOpenAIServer([text("too late", delay=5)]) as server:
        agent, _ = make_agent(server, tmp_path, sandbox, budget=Budget(max_time=0.5))
        result = await agent.arun("slow")
    assert result.status == "budget_exhausted" and result.budget == "time"
    assert "time budget" in result.answer
    read(result.notebook_path)


@pytest.mark.parametrize("vision", [False, True])
async def test_plots_reach_vision_models_as_images_and_others_as_placeholders(
    tmp_path, vision, sandbox
):
    with ScriptedOpenAIServer(
        [tool_calls(py("show_png()", id="p")), text("a line going up")]
    ) as server:
        agent, _ = make_agent(server, tmp_path, sandbox, vision=vision)
        assert (await sandbox.run_python(SHOW_PNG)).status == "ok"
        await agent.arun("plot")
        messages = server.chat_requests[1].messages
    result = json.loads(messages[3]["content"])
    assert result["output"].startswith("[image/png #1, 2.9 KB]")
    raw = json.dumps(messages)
    if vision:
        assert messages[4]["role"] == "user"
        assert messages[4]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    else:
        assert len(messages) == 4 and "image_url" not in raw and PNG[:100] not in raw
        assert "placeholders" in messages[0]["content"]


async def test_listeners_may_be_sync_async_or_broken(tmp_path, sandbox):
    seen_sync: list[str] = []
    seen_async: list[str] = []

    async def async_listener(event):
        await asyncio.sleep(0)
        seen_async.append(type(event).__name__)

    def broken(event):
        raise RuntimeError("listener bug")

    with ScriptedOpenAIServer([tool_calls(py("1")), text("ok")]) as server:
        agent, _ = make_agent(
            server,
            tmp_path,
            sandbox,
            listeners=[lambda e: seen_sync.append(type(e).__name__), async_listener, broken],
        )
        result = await agent.arun("hi")
    assert result.ok
    expected = [
        "SessionStarted", "TurnStarted", "ModelResponded", "ToolCallStarted",
        "ToolCallFinished", "TurnStarted", "ModelResponded", "AnswerGiven", "SessionEnded",
    ]  # fmt: skip
    assert seen_sync == expected and seen_async == expected


def test_blocking_run_works_inside_and_outside_an_event_loop(tmp_path):
    config = SandboxConfig(host="local")
    idle = AsyncSandbox(config, LocalKernelHost("unit", config), "unit")  # never started
    with ScriptedOpenAIServer([text("one"), text("two")]) as server:
        agent, _ = make_agent(server, tmp_path, idle, record=False)
        assert agent.run("plain").answer == "one"

        async def inside_a_loop():
            return agent.run("from a coroutine")

        result = asyncio.run(inside_a_loop())
    asyncio.run(idle.close())
    assert result.answer == "two" and result.notebook_path is None


async def test_tool_results_carry_the_tool_result_event(tmp_path, sandbox):
    finished: list[ToolCallFinished] = []
    with ScriptedOpenAIServer([tool_calls(py("print('hello')", id="h")), text("ok")]) as server:
        agent, _ = make_agent(
            server,
            tmp_path,
            sandbox,
            listeners=[lambda e: finished.append(e) if isinstance(e, ToolCallFinished) else None],
        )
        await agent.arun("hi")
    assert len(finished) == 1 and finished[0].call_id == "h"
    assert finished[0].result.ok and finished[0].result.output == "hello"


async def test_a_model_call_that_times_out_is_retried(tmp_path, sandbox):
    policy = RetryPolicy(max_retries=3, initial_delay=0.01, request_timeout=1)
    retries: list = []
    with ScriptedOpenAIServer([text("too slow", delay=5)] + [text("quick")] * 3) as server:
        agent, _ = make_agent(server, tmp_path, sandbox, retry=policy, listeners=[retries.append])
        result = await agent.arun("hi")
    assert result.status == "completed" and result.answer == "quick"
    retried = [e for e in retries if isinstance(e, ModelRetrying)]
    assert retried and "timed out" in retried[0].error
