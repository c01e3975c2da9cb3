"""``kernel-sandbox agent --resume``: a recorded session goes on in a fresh sandbox.

Real ``openai`` client against the local OpenAI-compatible server, real containers.
The first session leaves a variable and a file written by a tool; the resumed session
gets both back by replay, the model sees the earlier conversation, and the new notebook
links its parent.  A parent whose replay diverges stops the resume, naming the cell,
unless ``--allow-divergence``.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from kernel_sandbox.notebook import META_KEY
from tests.integration.test_agent import _agent_cli, py
from tests.openai_server import ScriptedOpenAIServer, call, text, tool_calls

pytestmark = pytest.mark.integration

MODEL = ("--api-key", "test", "--model", "scripted-analyst", "--max-turns", "5")


def _notebook_of(stdout: str) -> Path:
    return Path(stdout.strip().splitlines()[-1].removeprefix("notebook: "))


def _first_session(docker_engine, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    write = call(
        "file_operation", {"operation": "write", "file_path": "notes.txt", "content": "hi"}
    )
    with ScriptedOpenAIServer(
        [
            tool_calls(py("x = 21\nprint('x is', x)"), write),
            text("Stored x and wrote notes.txt."),
        ]
    ) as server:
        done = _agent_cli(
            docker_engine, "Remember 21 and write notes.txt", "--base-url", server.base_url,
            "--notebook-dir", str(tmp_path), *MODEL,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    path = _notebook_of(done.stdout)
    messages = nbformat.read(path, as_version=4).metadata[META_KEY]["messages"]
    assert [m["role"] for m in messages][:2] == ["system", "user"]
    return path


def test_resume_rebuilds_state_and_conversation(docker_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    parent = _first_session(docker_engine, tmp_path)

    def answer(request):  # type: ignore[no-untyped-def]
        return text("Result: " + request.tool_results()[-1]["output"].strip())

    with ScriptedOpenAIServer(
        [tool_calls(py("print(x * 2, open('notes.txt').read())")), answer]
    ) as server:
        done = _agent_cli(
            docker_engine, "Double it and read the note", "--resume", str(parent),
            "--base-url", server.base_url, "--notebook-dir", str(tmp_path), *MODEL,
        )  # fmt: skip
        sent = server.chat_requests[0].messages
    assert done.returncode == 0, done.stdout + done.stderr
    assert "answer:\nResult: 42 hi" in done.stdout, done.stdout
    # the model saw the earlier conversation, then the new question
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert users == ["Remember 21 and write notes.txt", "Double it and read the note"]
    assert any(m["role"] == "tool" for m in sent)

    child = _notebook_of(done.stdout)
    assert child != parent
    nb = nbformat.read(child, as_version=4)
    nbformat.validate(nb)
    session = nb.metadata[META_KEY]
    assert session["parent"]["path"] == str(parent)
    assert session["resumed"]["diverged"] == []
    sources = [c.source for c in nb.cells]
    assert any("x = 21" in s for s in sources)  # the parent's cells come first
    notes = [i for i, s in enumerate(sources) if s.startswith("**Resumed**")]
    assert notes and any("x * 2" in s for s in sources[notes[0] :])
    assert session["status"] == "completed"
    # the child can be resumed in turn: it carries the whole conversation
    assert [m["content"] for m in session["messages"] if m["role"] == "user"] == users


def test_a_diverging_replay_stops_unless_allowed(docker_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    parent = _first_session(docker_engine, tmp_path)
    nb = nbformat.read(parent, as_version=4)
    index, cell = next((i, c) for i, c in enumerate(nb.cells) if "x = 21" in c.source)
    cell.outputs[0]["text"] = "x is 22\n"  # the recorded output no longer matches
    nbformat.write(nb, parent)

    with ScriptedOpenAIServer([text("never asked")]) as server:
        done = _agent_cli(
            docker_engine, "go on", "--resume", str(parent), "--base-url", server.base_url,
            "--notebook-dir", str(tmp_path), *MODEL,
        )  # fmt: skip
        assert server.chat_requests == []  # the model was not called
    assert done.returncode == 1
    assert f"diverged at cell {index}" in done.stderr + done.stdout
    assert "--allow-divergence" in done.stderr + done.stdout

    with ScriptedOpenAIServer([text("going on anyway")]) as server:
        done = _agent_cli(
            docker_engine, "go on", "--resume", str(parent), "--allow-divergence",
            "--base-url", server.base_url, "--notebook-dir", str(tmp_path), *MODEL,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "going on anyway" in done.stdout
    child = nbformat.read(_notebook_of(done.stdout), as_version=4)
    diverged = child.metadata[META_KEY]["resumed"]["diverged"]
    assert diverged and diverged[0].startswith(f"cell {index}")
    assert json.dumps(child.metadata[META_KEY]["parent"]).count(str(parent.name)) == 1
