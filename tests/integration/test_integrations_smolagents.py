"""smolagents' own ``CodeAgent`` runs its code actions in our kernel: the real
``OpenAIServerModel`` (openai client) against the local OpenAI-compatible server, a real
sandbox, a real notebook."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path
from typing import Any

import nbformat
import pytest
from smolagents import CodeAgent, OpenAIServerModel
from smolagents.agent_types import AgentImage
from smolagents.memory import ActionStep
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.utils import AgentError

from kernel_sandbox import Sandbox
from kernel_sandbox.integrations.smolagents import KernelSandboxExecutor
from kernel_sandbox.notebook.replay import areplay
from tests.conftest import TEST_LABEL
from tests.openai_server import ScriptedOpenAIServer, image_urls, text

pytestmark = pytest.mark.integration

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
)


def code(source: str) -> Any:
    return text(f"Thought: next step.\n<code>\n{source}\n</code>")


def _texts(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if p.get("type") == "text")


async def test_code_agent_keeps_state_sees_plots_errors_and_files(
    docker_engine: object, tmp_path: Path
) -> None:
    script = [
        code("x = 21"),
        code("x * 2"),
        code(PLOT),
        code("1/0"),
        code("with open('note.txt', 'w') as f:\n    f.write('written-in-kernel')"),
        code("print(open('note.txt').read())"),
        code("final_answer(x * 2)"),
    ]
    quiet = AgentLogger(LogLevel.OFF)
    executor = KernelSandboxExecutor(
        config={"labels": TEST_LABEL}, record_dir=tmp_path, logger=quiet
    )
    with ScriptedOpenAIServer(script) as server:
        model = OpenAIServerModel("scripted", api_base=server.base_url, api_key="test")
        with CodeAgent(
            tools=[],
            model=model,
            executor=executor,
            step_callbacks=[executor.show_images],
            verbosity_level=LogLevel.OFF,
        ) as agent:
            answer = agent.run("What is x * 2?")
            steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
            assert executor.sandbox.files.read_text("note.txt") == "written-in-kernel"
        requests = server.chat_requests
    assert executor.sandbox.closed  # the agent's cleanup closed the sandbox it made

    assert answer == 42
    assert "Last output from code snippet:\n42" in steps[1].observations
    assert isinstance(steps[2].action_output, AgentImage)
    assert steps[2].action_output.to_raw().size[0] > 100
    after_plot = requests[3].messages  # the request that followed the plot
    assert [u[:30] for u in image_urls(after_plot)] == ["data:image/png;base64,iVBORw0K"]
    after_error = "\n".join(_texts(m) for m in requests[4].messages)
    assert "ZeroDivisionError" in after_error
    assert "written-in-kernel" in steps[5].observations

    nb = nbformat.read(executor.notebook, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    first = sources.index("x = 21")  # after the cell defining the tools
    assert sources[first : first + 2] == ["x = 21", "x * 2"]
    assert "final_answer(x * 2)" in sources[first:]
    report = await areplay(
        executor.notebook,
        output=tmp_path / "replayed.ipynb",
        sandbox_options={"labels": TEST_LABEL},
    )
    assert report.cells_by_index[sources.index("x * 2")].verdict == "same"


class _WritesAFile:
    """Unpickling this creates a file: proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


def test_a_pickled_final_answer_from_the_sandbox_is_refused(
    docker_engine: object, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    payload = base64.b64encode(pickle.dumps(_WritesAFile(str(marker)))).decode()
    with (
        Sandbox.create(labels=TEST_LABEL) as sandbox,
        KernelSandboxExecutor(sandbox, record_dir=tmp_path, logger=AgentLogger(LogLevel.OFF)) as ex,
    ):
        forged = (
            "class FinalAnswerException(BaseException):\n    pass\n"
            f"raise FinalAnswerException('pickle:{payload}')"
        )
        with pytest.raises(AgentError, match="Pickle data rejected"):
            ex(forged)
        ex.send_tools(_final_answer_tools())
        with pytest.raises(AgentError, match="Cannot safely serialize"):
            ex("final_answer(object())")  # no pickle fallback inside the sandbox either
        assert not sandbox.closed  # a sandbox passed in is the caller's to close
    assert not marker.exists()


def _final_answer_tools() -> dict[str, Any]:
    from smolagents.default_tools import FinalAnswerTool

    return {"final_answer": FinalAnswerTool()}


def test_anything_but_a_blocking_sandbox_is_refused_with_a_reason() -> None:
    with pytest.raises(TypeError, match=r"pass a kernel_sandbox\.Sandbox"):
        KernelSandboxExecutor(object())  # type: ignore[arg-type]
