"""Message assembly for the agent loop and Agent settings: no model, no sandbox."""

from __future__ import annotations

import base64
import json

import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletion

from kernel_sandbox.agent import Agent, system_prompt
from kernel_sandbox.agent.agent import DEFAULT_MODEL, MODEL_ENV
from kernel_sandbox.agent.messages import (
    assistant_message,
    image_message,
    parse_reply,
    tool_message,
)
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.tools import ToolResult
from kernel_sandbox.tools.results import render_outputs

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 2000).decode()


def completion(message: dict, finish_reason: str = "stop") -> ChatCompletion:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    return ChatCompletion.model_validate(body)


def fn_call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_plain_answer_has_no_calls():
    reply = parse_reply(completion({"role": "assistant", "content": "42"}))
    assert reply.text == "42" and reply.calls == [] and reply.finish_reason == "stop"
    assert assistant_message(reply) == {"role": "assistant", "content": "42"}


def test_parallel_calls_keep_order_and_round_trip_into_history():
    reply = parse_reply(
        completion(
            {
                "role": "assistant",
                "content": "Two things at once.",
                "tool_calls": [
                    fn_call("a", "python_executor", '{"code": "1"}'),
                    fn_call("b", "shell_executor", '{"command": "ls"}'),
                ],
            },
            "tool_calls",
        )
    )
    assert [(c.id, c.name) for c in reply.calls] == [
        ("a", "python_executor"),
        ("b", "shell_executor"),
    ]
    message = assistant_message(reply)
    assert message["content"] == "Two things at once."
    assert [tc["id"] for tc in message["tool_calls"]] == ["a", "b"]
    assert message["tool_calls"][1]["function"] == {
        "name": "shell_executor",
        "arguments": '{"command": "ls"}',
    }


def test_malformed_calls_are_normalised_not_raised():
    raw = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": None, "type": "function", "function": {"name": None, "arguments": None}},
            fn_call("dup", "python_executor", "{oops"),
            fn_call("dup", "python_executor", '{"code": "2"}'),
            {"id": "c", "type": "custom", "custom": {"name": "grep", "input": "x"}},
        ],
    }
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": raw, "finish_reason": "tool_calls"}],
    }
    # Built as the SDK builds responses (no validation), so nulls survive as they would.
    reply = parse_reply(construct_type(type_=ChatCompletion, value=body))
    first, bad_json, dup, custom = reply.calls
    assert first.id.startswith("call_") and first.name == "" and first.arguments == ""
    assert bad_json.arguments == "{oops" and bad_json.problem is None
    assert dup.id != bad_json.id and dup.id.startswith("dup")
    assert custom.problem and "custom" in custom.problem and custom.name == "grep"
    history = assistant_message(reply)["tool_calls"]
    assert len({tc["id"] for tc in history}) == 4
    assert all(tc["type"] == "function" and tc["function"]["name"] for tc in history)
    assert history[0]["function"]["arguments"] == "{}"


def test_a_completion_without_choices_is_an_endpoint_error():
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
    with pytest.raises(ValueError, match="without choices"):
        parse_reply(ChatCompletion.model_validate(body))


def test_refusal_without_content_becomes_the_text():
    reply = parse_reply(completion({"role": "assistant", "content": None, "refusal": "no"}))
    assert reply.refusal == "no"
    assert assistant_message(reply)["content"] == "no"


def plot_result() -> ToolResult:
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": "plotted\n"},
        {
            "output_type": "display_data",
            "data": {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
            "metadata": {},
        },
    ]
    text, artifacts = render_outputs(outputs)
    return ToolResult(
        status="success",
        tool_name="python_executor",
        output=text,
        artifacts=artifacts,
        outputs=outputs,
    )


def test_tool_message_is_compact_json_with_a_placeholder():
    message = tool_message("call_1", plot_result())
    assert message["role"] == "tool" and message["tool_call_id"] == "call_1"
    content = json.loads(message["content"])
    assert content["status"] == "success"
    assert "[image/png #1, 2.0 KB]" in content["output"]
    assert PNG[:40] not in message["content"] and len(message["content"]) < 1000


def test_images_go_to_one_user_message_for_vision_models():
    message = image_message(
        [("call_1", plot_result()), ("call_2", ToolResult(status="success", tool_name="x"))]
    )
    assert message is not None and message["role"] == "user"
    kinds = [p["type"] for p in message["content"]]
    assert kinds == ["text", "image_url"]
    assert (
        "call_1" in message["content"][0]["text"]
        and "image/png #1" in message["content"][0]["text"]
    )
    assert message["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert image_message([("c", ToolResult(status="success", tool_name="x"))]) is None


def test_system_prompt_says_what_persists_and_how_images_arrive():
    blind = system_prompt(working_dir="/sandbox", vision=False)
    seeing = system_prompt(working_dir="/work", network=True, vision=True)
    assert "persistent" in blind and "/sandbox" in blind and "no network" in blind
    assert "placeholders" in blind and "shown to you as images" not in blind
    assert "shown" in seeing and "as images" in seeing and "/work" in seeing
    assert "no network" not in seeing


def test_agent_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://user:secret@localhost:9/v1?key=abc")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv(MODEL_ENV, "env-model")
    agent = Agent()
    assert agent.model == "env-model"
    described = agent.describe()
    assert described["base_url"] == "http://localhost:9/v1"  # no credentials, no query
    assert "sk-test" not in json.dumps(described)
    assert Agent(model="explicit").model == "explicit"


def test_agent_without_any_key_or_endpoint_says_what_to_set(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", MODEL_ENV, "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Agent()
    local = Agent(base_url="http://127.0.0.1:9/v1")  # local endpoints need no key
    assert local.model == DEFAULT_MODEL


def test_agent_reserves_the_request_fields_it_sets():
    with pytest.raises(ConfigError, match="tools"):
        Agent(base_url="http://x/v1", completion_options={"tools": []})
    Agent(base_url="http://x/v1", completion_options={"temperature": 0})


def test_tools_config_is_taken_from_a_manager_config():
    from kernel_sandbox import DockerSandboxConfig

    config = DockerSandboxConfig(tools_config={"python_executor": {}})
    agent = Agent(base_url="http://x/v1", config=config)
    assert agent.tools_config == {"python_executor": {}}
