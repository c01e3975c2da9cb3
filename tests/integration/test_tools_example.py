"""ms-enclave's OpenAI-tools program runs unchanged: the docs' copy and the example file.

Each run is a separate Python process (as a user would run it) talking to the scripted
OpenAI-compatible server through OPENAI_BASE_URL; the model asks for a Python and a
shell call in parallel, then answers from the results it was sent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.conftest import require
from tests.integration.conftest import PYTHON_IMAGE
from tests.openai_server import RecordedRequest, Reply, ScriptedOpenAIServer, call, text, tool_calls

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_tools.py"
PLAIN_IMAGE = "python:3.11-slim"


def docs_example() -> str:
    """The Python block of the docs' tools page that uses the manager."""
    page = (ROOT / "docs" / "concepts" / "tools.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    found = [b for b in blocks if "SandboxManagerFactory.create_manager()" in b]
    assert len(found) == 1, "the tools page should show the example exactly once"
    return found[0]


def summarize(request: RecordedRequest) -> Reply:
    python, shell = request.tool_results()
    return text(
        f"123456 * 654321 = {python['output']}. "
        f"/sandbox/data: {shell['output'].splitlines()[-1].split()[-1]}"
    )


def run_program(
    script: Path, tmp_path: Path, engine: docker.DockerClient, image: str | None
) -> tuple[subprocess.CompletedProcess[str], ScriptedOpenAIServer]:
    output = tmp_path / "output"
    output.mkdir()
    output.chmod(0o777)
    (output / "notes.txt").write_text("results go here\n")
    server = ScriptedOpenAIServer(
        [
            tool_calls(
                call("python_executor", {"code": "print(123456 * 654321)", "timeout": None}),
                call(
                    "shell_executor",
                    {"command": "ls -l /sandbox/data", "timeout": None, "cwd": None},
                ),
            ),
            summarize,
        ]
    )
    env = {
        **os.environ,
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "test-key",
        "OPENAI_MODEL": "scripted-model",
    }
    env.pop("SANDBOX_IMAGE", None)
    if image:
        env["SANDBOX_IMAGE"] = image
    proc: subprocess.Popen[str] | None = None
    with server:
        env["OPENAI_BASE_URL"] = server.base_url
        try:
            proc = subprocess.Popen(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            stdout, stderr = proc.communicate(timeout=900)
        finally:
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                owned = {"label": f"kernel-sandbox.owner-pid={proc.pid}"}
                left = engine.containers.list(all=True, filters=owned)
                for container in left:
                    container.remove(force=True)
                assert not left, "the manager left its sandbox behind"
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done, server


def check_conversation(
    done: subprocess.CompletedProcess[str], server: ScriptedOpenAIServer
) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "123456 * 654321 = 80779853376. /sandbox/data: notes.txt"
    first, second = server.chat_requests
    assert [t["function"]["name"] for t in first.tools] == [
        "python_executor",
        "shell_executor",
        "file_operation",
    ]
    assert first.body["tool_choice"] == "auto"
    results = second.tool_results()
    assert [r["status"] for r in results] == ["success", "success"]
    assert [m["name"] for m in second.tool_messages] == ["python_executor", "shell_executor"]
    assert "tools" not in second.body  # the final call is a plain completion, as in the guide


def test_the_docs_example_runs(docker_engine: docker.DockerClient, tmp_path: Path) -> None:
    code = docs_example()
    example_body = EXAMPLE.read_text().split('"""', 2)[2].lstrip("\n")
    assert code == example_body, "docs/concepts/tools.md and examples/openai_tools.py drifted apart"
    script = tmp_path / "docs_example.py"
    script.write_text(code)
    done, server = run_program(script, tmp_path, docker_engine, PYTHON_IMAGE)
    check_conversation(done, server)


@pytest.mark.timeout(1200)
def test_the_example_runs_on_a_plain_python_image(
    docker_engine: docker.DockerClient, tmp_path: Path
) -> None:
    try:
        docker_engine.images.get(PLAIN_IMAGE)
    except docker.errors.ImageNotFound:
        require(False, f"image {PLAIN_IMAGE} missing: make the stand-in (see the images section)")
    done, server = run_program(EXAMPLE, tmp_path, docker_engine, image=None)
    check_conversation(done, server)
