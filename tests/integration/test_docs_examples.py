"""The first programs a newcomer runs: the README's example, the getting-started page's,
and the LangChain and smolagents pages' on a scripted model (the Agents SDK's and
pydantic-ai's programs name OpenAI's Responses API, which the scripted server does not
serve; their adapters are tested in ``test_integrations_*.py``).

Each runs as a user would run it, in a separate Python process; whatever sandbox it
leaves behind (it should leave none) is removed by its owner pid and fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.openai_server import ScriptedOpenAIServer, call, text, tool_calls

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def python_block(page: Path, needle: str) -> str:
    """The one ```python block of ``page`` that contains ``needle``."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"{page.name} should show one example with {needle!r}"
    return found[0]


def run_program(code: str, tmp_path: Path, engine: docker.DockerClient) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = engine.containers.list(
            all=True, filters={"label": f"kernel-sandbox.owner-pid={proc.pid}"}
        )
        for container in left:
            container.remove(force=True)
    assert not left, "the example left its sandbox behind"
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


def test_the_readme_example_runs(docker_engine: docker.DockerClient, tmp_path: Path) -> None:
    code = python_block(ROOT / "README.md", "AsyncSandbox.create(")
    out = run_program(code, tmp_path, docker_engine)
    assert out.startswith("ok ") and "\nmean " in out  # df.describe() as text
    assert "\ntotal " in out  # the `ls -la`


def test_the_getting_started_example_runs(
    docker_engine: docker.DockerClient, tmp_path: Path
) -> None:
    code = python_block(ROOT / "docs" / "getting-started.md", "AsyncSandbox.create(")
    out = run_program(code, tmp_path, docker_engine)
    assert out.startswith("ok ") and "\nmean " in out
    assert "in.csv" in out  # files.list("data") after the write


def test_the_kernels_page_example_runs(docker_engine: docker.DockerClient, tmp_path: Path) -> None:
    code = python_block(ROOT / "docs" / "how-to" / "kernels.md", "AsyncSandbox.create(")
    out = run_program(code, tmp_path, docker_engine)
    assert out.splitlines()[:3] == ["[1] 2", "[1] 3 6", "['python', 'r', 'javascript']"], out


# -- the framework pages' programs, on a scripted model ---------------------------------


@pytest.fixture
def scripted_openai(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedOpenAIServer]:
    """A local OpenAI-compatible server the programs reach through the environment, as
    they would reach OpenAI (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``)."""
    with ScriptedOpenAIServer([]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        yield server


def _tool_texts(server: ScriptedOpenAIServer) -> str:
    out = []
    for message in server.chat_requests[-1].tool_messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append(str(content))
    return "\n".join(out)


def test_the_langchain_page_program_runs(
    docker_engine: docker.DockerClient, tmp_path: Path, scripted_openai: ScriptedOpenAIServer
) -> None:
    scripted_openai.add(
        tool_calls(call("python_executor", {"code": "ys = [x**2 for x in range(11)]\nys[7]"})),
        text("y at x = 7 is 49"),
    )
    code = python_block(ROOT / "docs" / "how-to" / "langchain.md", "sandbox_tools(")
    out = run_program(code, tmp_path, docker_engine)
    assert out.strip() == "y at x = 7 is 49"
    assert '"output":"49"' in _tool_texts(scripted_openai)
    assert (tmp_path / "langchain-session.ipynb").exists()


def test_the_smolagents_page_program_runs(
    docker_engine: docker.DockerClient, tmp_path: Path, scripted_openai: ScriptedOpenAIServer
) -> None:
    scripted_openai.add(
        text("Thought: compute.\n<code>\nys = [x**2 for x in range(11)]\nprint(ys[7])\n</code>"),
        text("Thought: done.\n<code>\nfinal_answer(ys[7])\n</code>"),
    )
    code = python_block(ROOT / "docs" / "how-to" / "smolagents.md", "KernelSandboxExecutor(")
    out = run_program(code, tmp_path, docker_engine)
    answer, notebook = out.strip().splitlines()[-2:]
    assert answer == "49" and notebook.startswith("notebook: ")
    assert Path(notebook.removeprefix("notebook: ")).exists()
