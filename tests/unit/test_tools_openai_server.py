"""The scripted OpenAI-compatible server, driven by the real openai client.

The agent-loop and tools tests rely on it, so its behaviour is pinned here: parallel
tool calls, retried errors, streaming, strict-mode checks of the tools sent; the same
script served as the Responses API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet
from tests.openai_server import (
    RecordedRequest,
    ScriptedOpenAIServer,
    call,
    error,
    strict_schema_problems,
    text,
    tool_calls,
)


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


def client_for(server: ScriptedOpenAIServer, **kwargs: object) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="test-key", **kwargs)  # type: ignore[arg-type]


def test_parallel_tool_calls_reach_the_client_parsed(server: ScriptedOpenAIServer) -> None:
    server.add(
        tool_calls(
            call("python_executor", {"code": "print(1)"}, id="call_a"),
            call("shell_executor", {"command": "ls"}, id="call_b"),
        )
    )
    completion = client_for(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [c.id for c in calls] == ["call_a", "call_b"]
    assert json.loads(calls[0].function.arguments) == {"code": "print(1)"}
    assert server.chat_requests[0].messages == [{"role": "user", "content": "go"}]
    assert server.chat_requests[0].headers["authorization"] == "Bearer test-key"


def test_rate_limit_and_server_errors_are_retried_by_the_sdk(server: ScriptedOpenAIServer) -> None:
    server.add(error(429, "slow down"), error(503, "busy"), text("finally"))
    completion = client_for(server, max_retries=2).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices[0].message.content == "finally"
    assert len(server.chat_requests) == 3


def test_errors_surface_as_sdk_exceptions_when_retries_run_out(
    server: ScriptedOpenAIServer,
) -> None:
    server.add(error(500, "boom"))
    with pytest.raises(openai.InternalServerError, match="boom"):
        client_for(server, max_retries=0).chat.completions.create(model="m", messages=[])


def test_an_exhausted_script_fails_loudly(server: ScriptedOpenAIServer) -> None:
    with pytest.raises(openai.InternalServerError, match="no reply left"):
        client_for(server, max_retries=0).chat.completions.create(model="m", messages=[])


def test_reply_functions_see_the_request(server: ScriptedOpenAIServer) -> None:
    def answer(request: RecordedRequest) -> object:
        results = request.tool_results()
        return text(f"the tool said {results[0]['output']}")

    server.add(answer)
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("python_executor", {"code": "1"}, id="c1")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"output": "42"})},
    ]
    completion = client_for(server).chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "the tool said 42"


def test_streaming_delivers_content_and_tool_call_arguments(server: ScriptedOpenAIServer) -> None:
    server.add(
        tool_calls(call("python_executor", {"code": "x = 1\nprint(x)"}, id="s1"), content="ok")
    )
    stream = client_for(server).chat.completions.create(model="m", messages=[], stream=True)
    content, args, finish = "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            args += tc.function.arguments or "" if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "ok"
    assert json.loads(args) == {"code": "x = 1\nprint(x)"}
    assert finish == "tool_calls"


def test_our_tool_schemas_pass_the_strict_mode_check(
    server: ScriptedOpenAIServer, idle_sandbox: AsyncSandbox
) -> None:
    tools = ToolSet(idle_sandbox).schemas()
    server.add(text("fine"))
    completion = client_for(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == "fine"
    assert server.chat_requests[0].tools == tools


def test_a_schema_that_breaks_strict_mode_is_rejected_with_400(
    server: ScriptedOpenAIServer,
) -> None:
    bad = {
        "type": "function",
        "function": {
            "name": "f",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "integer", "default": 3}},
                "required": ["a"],
            },
        },
    }
    with pytest.raises(openai.BadRequestError, match="additionalProperties"):
        client_for(server).chat.completions.create(model="m", messages=[], tools=[bad])  # type: ignore[list-item]
    problems = strict_schema_problems(bad["function"]["parameters"])  # type: ignore[index]
    assert any("missing ['b']" in p for p in problems)
    assert any("default" in p for p in problems)


def test_models_endpoint_lists_the_model(server: ScriptedOpenAIServer) -> None:
    models = client_for(server).models.list()
    assert [m.id for m in models] == ["scripted-model"]


# -- the Responses API ------------------------------------------------------------------


def test_responses_api_serves_function_calls_then_text_from_the_script(
    server: ScriptedOpenAIServer,
) -> None:
    server.add(
        tool_calls(call("python_executor", {"code": "x = 21"}, id="r1"), content="first"),
        lambda request: text(f"the tool said {request.tool_texts()[0]}"),
    )
    client = client_for(server)
    first = client.responses.create(model="m", input="go")
    assert first.status == "completed" and first.output_text == "first"
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("r1", "python_executor", {"code": "x = 21"})
    ]
    assert first.usage is not None and first.usage.total_tokens == 15
    second = client.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "go"},
            {"type": "function_call_output", "call_id": "r1", "output": "42"},
        ],
    )
    assert second.output_text == "the tool said 42"
    recorded = server.responses_requests
    assert [r.input[0] for r in recorded] == [{"role": "user", "content": "go"}] * 2
    assert recorded[1].function_outputs == [
        {"type": "function_call_output", "call_id": "r1", "output": "42"}
    ]


def test_responses_api_streams_events_ending_in_the_whole_response(
    server: ScriptedOpenAIServer,
) -> None:
    server.add(tool_calls(call("python_executor", {"code": "x * 2"}, id="s1"), content="a" * 40))
    events = list(client_for(server).responses.create(model="m", input="go", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "a" * 40
    args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in args] == [{"code": "x * 2"}]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "a" * 40 and [i.type for i in final.output] == [
        "message",
        "function_call",
    ]


def test_responses_api_checks_strict_function_tools(
    server: ScriptedOpenAIServer, idle_sandbox: AsyncSandbox
) -> None:
    tools = ToolSet(idle_sandbox).schemas("responses")
    server.add(text("fine"))
    client = client_for(server)
    reply = client.responses.create(model="m", input="hi", tools=tools)  # type: ignore[arg-type]
    assert reply.output_text == "fine"
    bad = {
        "type": "function",
        "name": "f",
        "strict": True,
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
    }
    with pytest.raises(openai.BadRequestError, match="additionalProperties"):
        client.responses.create(model="m", input="hi", tools=[bad])  # type: ignore[list-item]
