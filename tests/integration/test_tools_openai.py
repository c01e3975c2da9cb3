"""Tool calls from a model through the real openai client, executed in real sandboxes.

A scripted OpenAI-compatible server plays the model; a minimal loop (what any agent
does with these tools) sends the schemas, runs each tool call with the manager and
returns the results as ``tool`` messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from kernel_sandbox import DockerSandboxConfig, SandboxManager, SandboxManagerFactory, ToolResult
from tests.conftest import TEST_LABEL
from tests.integration.conftest import DATASCIENCE_IMAGE, PYTHON_IMAGE
from tests.openai_server import RecordedRequest, ScriptedOpenAIServer, call, text, tool_calls

pytestmark = pytest.mark.asyncio(loop_scope="module")

ALL_TOOLS = {"python_executor": {}, "shell_executor": {}, "file_operation": {}}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def manager(docker_engine: object) -> AsyncIterator[SandboxManager]:
    async with SandboxManagerFactory.create_manager(labels=TEST_LABEL) as mgr:
        yield mgr


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def py_id(manager: SandboxManager) -> str:
    config = DockerSandboxConfig(image=PYTHON_IMAGE, tools_config=ALL_TOOLS)
    return await manager.create_sandbox("docker", config)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ds_id(manager: SandboxManager) -> str:
    config = DockerSandboxConfig(image=DATASCIENCE_IMAGE, tools_config=ALL_TOOLS)
    return await manager.create_sandbox("docker", config)


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


async def converse(
    server: ScriptedOpenAIServer,
    manager: SandboxManager,
    sandbox_id: str,
    prompt: str,
    *,
    vision: bool = False,
    max_rounds: int = 6,
) -> tuple[str | None, list[ToolResult]]:
    """Call the model until it answers in text; return the answer and every tool result."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
    tools = await manager.get_sandbox_tools(sandbox_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    results: list[ToolResult] = []
    for _ in range(max_rounds):
        completion = await client.chat.completions.create(
            model="scripted-model",
            messages=messages,  # type: ignore[arg-type]
            tools=list(tools.values()),  # type: ignore[arg-type]
        )
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content, results
        for tc in message.tool_calls:
            # the raw JSON string, exactly as the model sent it
            result = await manager.execute_tool(sandbox_id, tc.function.name, tc.function.arguments)
            results.append(result)
            messages.append(result.to_tool_message(tc.id, vision=vision))
    raise AssertionError("the model never answered in text")


def last_tool_output(request: RecordedRequest) -> str:
    return str(request.tool_results()[-1]["output"])


async def test_python_state_survives_between_model_turns(
    server: ScriptedOpenAIServer, manager: SandboxManager, py_id: str
) -> None:
    server.add(
        tool_calls(call("python_executor", {"code": "prices = [3.5, 1.25, 2.0]", "timeout": None})),
        tool_calls(call("python_executor", {"code": "sorted(prices)", "timeout": None})),
        lambda request: text(f"Sorted: {last_tool_output(request)}"),
    )
    answer, results = await converse(server, manager, py_id, "Sort these prices.")
    assert answer == "Sorted: [1.25, 2.0, 3.5]"
    assert [r.status for r in results] == ["success", "success"]
    assert len(server.chat_requests) == 3
    # what the model was sent in the last turn: both results, as compact JSON
    sent = server.chat_requests[2].tool_results()
    assert [s["status"] for s in sent] == ["success", "success"]
    assert sent[1]["output"] == "[1.25, 2.0, 3.5]"
    assert {t["function"]["name"] for t in server.chat_requests[0].tools} == set(ALL_TOOLS)


async def test_bad_calls_come_back_as_errors_the_model_can_repair(
    server: ScriptedOpenAIServer, manager: SandboxManager, py_id: str
) -> None:
    server.add(
        tool_calls(
            call("run_code", {"code": "1"}),  # unknown tool
            call("python_executor", '{"code": "print(1)'),  # JSON cut short
            call("python_executor", {"timeout": 5}),  # missing argument
            call("shell_executor", {"command": "ls", "shell": "bash"}),  # extra argument
            call("python_executor", {"code": "undefined_name + 1"}),  # the code raises
        ),
        tool_calls(call("python_executor", {"code": "defined_now = 41\ndefined_now + 1"})),
        lambda request: text(last_tool_output(request)),
    )
    answer, results = await converse(server, manager, py_id, "Try things.")
    errors = [r.error for r in results[:5]]
    assert [r.status for r in results[:5]] == ["error"] * 5
    assert errors[0] is not None and "available tools are: python_executor" in errors[0]
    assert errors[1] is not None and "not valid JSON" in errors[1]
    assert errors[2] is not None and "missing required argument 'code'" in errors[2]
    assert errors[3] is not None and "unexpected argument 'shell'" in errors[3]
    assert errors[4] == "NameError: name 'undefined_name' is not defined"
    assert answer == "42"
    # every failure reached the model as a tool message answering its call id
    request = server.chat_requests[1]
    call_ids = [tc["id"] for tc in request.messages[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in request.tool_messages] == call_ids


async def test_a_plot_reaches_the_result_and_the_model_gets_a_small_json(
    server: ScriptedOpenAIServer, manager: SandboxManager, ds_id: str
) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "import numpy as np\n"
        "x = np.linspace(0, 10, 500)\n"
        "fig, ax = plt.subplots(figsize=(8, 5))\n"
        "ax.plot(x, np.sin(x) * np.exp(-x / 5))\n"
        "ax.set_title('damped')\n"
        "plt.show()\n"
        "print('drawn')"
    )
    server.add(
        tool_calls(call("python_executor", {"code": code, "timeout": 60})),
        lambda request: text(f"I made {last_tool_output(request)}"),
    )
    answer, results = await converse(server, manager, ds_id, "Plot a damped sine.")
    (result,) = results
    assert result.status == "success", result.error
    pngs = result.images()
    assert len(pngs) == 1 and pngs[0].startswith(PNG_MAGIC) and len(pngs[0]) > 10_000
    content = server.chat_requests[1].tool_messages[0]["content"]
    assert isinstance(content, str)
    assert len(content.encode()) < 2048, content
    assert "iVBOR" not in json.dumps(server.chat_requests[1].body)  # no base64 PNG anywhere
    sent = json.loads(content)
    assert re.fullmatch(
        r"\[image/png #1, \d+\.\d KB\] <Figure size 800x500 with 1 Axes>\ndrawn", sent["output"]
    )
    assert sent["artifacts"][0]["name"] == "image/png #1"
    assert answer is not None and "[image/png #1" in answer


async def test_vision_models_get_the_image_as_a_content_part(
    server: ScriptedOpenAIServer, manager: SandboxManager, ds_id: str
) -> None:
    code = "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nplt.show()"
    server.add(tool_calls(call("python_executor", {"code": code, "timeout": 60})), text("seen"))
    answer, results = await converse(server, manager, ds_id, "Chart it.", vision=True)
    assert answer == "seen"
    parts = server.chat_requests[1].tool_messages[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"]
    assert json.loads(parts[0]["text"])["artifacts"][0]["name"] == "image/png #1"
    url = parts[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,iVBOR")
    assert len(url) > len(parts[0]["text"])  # the image is really there
    assert results[0].images()[0].startswith(PNG_MAGIC)
