"""The first programs a newcomer runs: the README's example, the getting-started page's,
and the framework pages' (LangChain, smolagents, the OpenAI Agents SDK, pydantic-ai) on
a scripted model — the last two on the Responses API, the one their default OpenAI
models use.

Each runs as a user would run it, in a separate Python process; whatever sandbox it
leaves behind (it should leave none) is removed and fails the test: by its owner pid,
or — for a sandbox of a server the program started (``kernel-sandbox mcp``) — one that
appeared during the run and whose owner has ended.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.openai_server import RecordedRequest, ScriptedOpenAIServer, call, text, tool_calls

# orphans: an example's leftovers are found as sandboxes whose owner ended meanwhile, so
# other tests' deliberate orphans must not appear (nor their gc take ours) while one runs
pytestmark = [pytest.mark.integration, pytest.mark.orphans]
ROOT = Path(__file__).resolve().parents[2]
OWNER = "kernel-sandbox.owner-pid"


def python_block(page: Path, needle: str) -> str:
    """The one ```python block of ``page`` that contains ``needle``."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"{page.name} should show one example with {needle!r}"
    return found[0]


def _orphans(engine: docker.DockerClient, before: set[str]) -> list[Any]:
    """Our containers made since ``before`` whose owner process has ended."""
    out = []
    # sparse: every process's sandboxes carry OWNER, and one removed between the listing
    # and an inspect would fail the listing; the list's own labels suffice
    for container in engine.containers.list(all=True, sparse=True, filters={"label": OWNER}):
        if container.id in before:
            continue
        try:
            os.kill(int((container.attrs.get("Labels") or {}).get(OWNER, "0")), 0)
        except (ProcessLookupError, ValueError):
            out.append(container)
        except PermissionError:
            pass
    return out


def run_program(code: str, tmp_path: Path, engine: docker.DockerClient) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = {c.id for c in engine.containers.list(all=True, sparse=True, filters={"label": OWNER})}
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
        left = engine.containers.list(all=True, filters={"label": f"{OWNER}={proc.pid}"})
        left += [c for c in _orphans(engine, before) if c.id not in {x.id for x in left}]
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
    return "\n".join(server.requests[-1].tool_texts())


def _answer_from_the_kernel(request: RecordedRequest) -> Any:
    """The model's answer: what the kernel gave for ``x * 2`` (the last result)."""
    last = request.tool_texts()[-1]  # our ToolResult's JSON, or MCP's text of the cell
    got = re.search(r'"output":"42"|^42$', last, re.M)
    return text("x * 2 is 42" if got else f"no 42 in {last}")


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


def _two_dependent_calls(server: ScriptedOpenAIServer, tool: str) -> None:
    """``x = 21`` in one call, ``x * 2`` in the next (needs the first's state), then an
    answer made from the second's result."""
    server.add(
        tool_calls(call(tool, {"code": "x = 21"})),
        tool_calls(call(tool, {"code": "x * 2"})),
        _answer_from_the_kernel,
    )


def test_the_openai_agents_page_program_runs(
    docker_engine: docker.DockerClient,
    tmp_path: Path,
    scripted_openai: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page's Sandbox Agent program, unchanged: the SDK's default model (the
    Responses API) at ``OPENAI_BASE_URL``, its ``KernelSandboxClient`` run recorded
    under ``XDG_DATA_HOME``."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no traces leave the machine
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    _two_dependent_calls(scripted_openai, "python_executor")
    code = python_block(ROOT / "docs" / "how-to" / "openai-agents.md", "KernelSandboxClient()")
    out = run_program(code, tmp_path, docker_engine)
    assert out.strip() == "x * 2 is 42", out
    requests = scripted_openai.responses_requests
    assert len(requests) == 3 and not scripted_openai.chat_requests
    assert "python_executor" in {t.get("name") for t in requests[0].tools}
    notebooks = list((tmp_path / "data" / "kernel-sandbox" / "agents-sessions").glob("*.ipynb"))
    assert len(notebooks) == 1
    assert "x * 2" in notebooks[0].read_text()


def test_the_pydantic_ai_page_program_runs(
    docker_engine: docker.DockerClient,
    tmp_path: Path,
    scripted_openai: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page's first program, unchanged: ``"openai:gpt-4.1"`` (pydantic-ai's Responses
    model) at ``OPENAI_BASE_URL``, ``kernel-sandbox mcp`` over stdio as its toolset."""
    _two_dependent_calls(scripted_openai, "run_python")
    code = python_block(ROOT / "docs" / "how-to" / "pydantic-ai.md", "StdioTransport(")
    bin_dir = Path(sys.executable).parent  # where `kernel-sandbox` is installed
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    out = run_program(code, tmp_path, docker_engine)
    assert out.strip() == "x * 2 is 42", out
    requests = scripted_openai.responses_requests
    assert len(requests) == 3 and not scripted_openai.chat_requests
    assert "run_python" in {t.get("name") for t in requests[0].tools}
    notebook = tmp_path / "pydantic-ai-session.ipynb"
    assert notebook.exists() and "x * 2" in notebook.read_text()
