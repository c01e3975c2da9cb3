"""Agent sessions against real sandboxes, with the real openai client and a scripted model.

The model is ``tests/openai_server.py``: each test scripts its replies (some computed from
what the loop sent back), so multi-round behaviour is exercised end to end: kernel state
across rounds, a plot reaching the notebook, a failing cell repaired, parallel calls,
API errors retried, budgets, and a notebook that survives ``kill -9``.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner

from kernel_sandbox.agent import Agent, Budget, RetryPolicy
from kernel_sandbox.cli.main import cli
from kernel_sandbox.notebook import META_KEY
from tests.conftest import TEST_LABEL
from tests.openai_server import ScriptedOpenAIServer, call, error, text, tool_calls
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=0.05)
CSV = "day,sales\n1,10\n2,14\n3,9\n4,20\n"
LOAD_INLINE = f"import io, pandas as pd\ndf = pd.read_csv(io.StringIO({CSV!r}))\ndf.describe()"
PLOT = textwrap.dedent(
    """\
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(df["day"], df["sales"], marker="o")
    ax.set_title("Sales per day")
    plt.show()
    int(df["sales"].sum())"""
)


def py(code: str, **kw: object) -> dict:
    return call("python_executor", {"code": code, "timeout": None}, **kw)  # type: ignore[arg-type]


def read(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


def meta(cell: nbformat.NotebookNode) -> dict:
    return cell.metadata.get(META_KEY, {})


def agent_for(server: ScriptedOpenAIServer, tmp_path: Path, **kw: object) -> Agent:
    kw.setdefault("retry", FAST)
    return Agent(
        base_url=server.base_url,
        api_key="test",
        model="scripted-analyst",
        notebook_dir=tmp_path / "sessions",
        **kw,  # type: ignore[arg-type]
    )


async def test_state_across_rounds_parallel_calls_and_a_plot_in_the_notebook(sandbox, tmp_path):
    def answer(request):
        results = request.tool_results()
        return text(
            f"Total sales: {results[-1]['output'].splitlines()[-1]}; shape {results[2]['output']}"
        )

    with ScriptedOpenAIServer(
        [
            tool_calls(  # three calls in one turn: they run in order
                call(
                    "file_operation",
                    {
                        "operation": "write",
                        "file_path": "data.csv",
                        "content": CSV,
                        "encoding": None,
                    },
                    id="w",
                ),
                call(
                    "shell_executor",
                    {"command": "wc -l data.csv", "timeout": None, "cwd": None},
                    id="s",
                ),
                py("import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(df.shape)", id="r"),
                content="Let me load the data.",
            ),
            tool_calls(py(PLOT, id="p")),  # uses df from the previous round
            answer,
        ]
    ) as server:
        agent = agent_for(server, tmp_path, sandbox=sandbox)
        result = await agent.arun("Load the sales data and plot it")
        requests = server.chat_requests

    assert result.status == "completed", result.reason
    assert result.answer == "Total sales: 53; shape (4, 2)"
    assert (result.turns, result.tool_calls) == (3, 4)
    second = requests[1].tool_results()
    assert [r["status"] for r in second] == ["success"] * 3
    assert second[1]["output"].startswith("5 data.csv")
    plot_result = requests[2].tool_results()[-1]
    assert plot_result["artifacts"][0]["mime_type"] == "image/png"
    assert "base64" not in json.dumps(plot_result) and len(json.dumps(plot_result)) < 2000

    nb = read(result.notebook_path)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    session = nb.metadata[META_KEY]
    assert session["status"] == "completed" and session["model"] == "scripted-analyst"
    assert session["image"] == sandbox.config.image
    cells = [c for c in nb.cells if meta(c).get("tool_call_id")]
    assert [meta(c)["tool_call_id"] for c in cells] == ["w", "s", "r", "p"]
    write, shell, load, plot = cells
    assert write.source.startswith("%%writefile /sandbox/data.csv") and CSV in write.source
    assert shell.source == "%%sh\nwc -l data.csv" and "5 data.csv" in shell.outputs[0]["text"]
    assert load.outputs[0]["text"] == "(4, 2)\n"
    assert plot.execution_count == load.execution_count + 1
    png = next(o for o in plot.outputs if "image/png" in o.get("data", {}))
    assert base64.b64decode(png["data"]["image/png"]).startswith(b"\x89PNG")
    assert plot.outputs[-1]["data"]["text/plain"] == "53"
    assert all(meta(c)["tool_status"] == "success" and "execution_time" in meta(c) for c in cells)
    texts = [c.source for c in nb.cells if meta(c).get("role") == "assistant"]
    assert texts == ["**Assistant**\n\nLet me load the data.", f"**Assistant**\n\n{result.answer}"]


async def test_a_failing_cell_is_repaired_in_the_next_round(sandbox, tmp_path):
    def repair(request):
        failed = request.tool_results()[-1]
        assert failed["status"] == "error" and "NameError" in failed["error"]
        assert "totl" in failed["output"]  # the traceback reached the model
        return tool_calls(py("total = sum(values)\ntotal", id="fixed"))

    with ScriptedOpenAIServer(
        [
            tool_calls(py("values = [3, 4, 5]\ntotal = sum(valuez)\ntotl", id="broken")),
            repair,
            lambda request: text(f"The total is {request.tool_results()[-1]['output']}."),
        ]
    ) as server:
        result = await agent_for(server, tmp_path, sandbox=sandbox).arun("Sum the values")

    assert result.status == "completed" and result.answer == "The total is 12."
    nb = read(result.notebook_path)
    broken, fixed = [c for c in nb.cells if c.cell_type == "code"]
    assert meta(broken)["tool_status"] == "error" and meta(broken)["tool_call_id"] == "broken"
    assert broken.outputs[-1]["output_type"] == "error"
    assert broken.outputs[-1]["ename"] == "NameError"
    assert (
        meta(fixed)["tool_status"] == "success" and fixed.outputs[0]["data"]["text/plain"] == "12"
    )


async def test_api_errors_are_retried_and_exhaustion_leaves_a_valid_notebook(sandbox, tmp_path):
    with ScriptedOpenAIServer(
        [
            tool_calls(py("kept = 'still here'")),
            error(429, "rate limited"),
            error(500, "oops"),
            text("done"),
        ]
    ) as server:
        agent = agent_for(server, tmp_path, sandbox=sandbox)
        async with agent.session() as session:
            first = await session.send("Do something")
            assert first.status == "completed" and first.answer == "done"
            assert len(server.chat_requests) == 4
            server.add(error(503, "down"), error(503, "down"), error(503, "still down"))
            failed = await session.send("And now?")
            assert failed.status == "error"
            assert failed.reason == (
                "the model API failed after 3 attempts: HTTP 503: still down; "
                "the endpoint had a server error"
            )
            # the sandbox survived the failed task with its state
            server.add(
                tool_calls(py("print(kept)")), lambda r: text(r.tool_results()[-1]["output"])
            )
            again = await session.send("What was kept?")
            assert again.answer == "still here"
    nb = read(first.notebook_path)
    assert nb.metadata[META_KEY]["status"] == "completed"
    notes = [c.source for c in nb.cells if meta(c).get("kind") == "note"]
    assert any("Model API error" in n and "still down" in n for n in notes)


async def test_a_turn_budget_stops_an_endless_session(sandbox, tmp_path):
    with ScriptedOpenAIServer(
        [lambda r: tool_calls(py("n = globals().get('n', 0) + 1\nn"))] * 5
    ) as server:
        agent = agent_for(server, tmp_path, sandbox=sandbox, budget=Budget(max_turns=3))
        result = await agent.arun("Count forever")
    assert result.status == "budget_exhausted" and result.budget == "turns"
    assert "the turn budget was reached (3 model calls, max_turns=3)" in result.answer
    nb = read(result.notebook_path)
    counts = [c.outputs[0]["data"]["text/plain"] for c in nb.cells if c.cell_type == "code"]
    assert counts == ["1", "2", "3"]
    assert nb.metadata[META_KEY]["status"] == "budget_exhausted"


def test_blocking_run_with_a_blocking_sandbox_keeps_it_running(docker_engine, tmp_path):
    from kernel_sandbox import Sandbox

    with Sandbox.create(image="kernel-sandbox:python", labels=TEST_LABEL) as sandbox:
        with ScriptedOpenAIServer(
            [tool_calls(py("answer = 6 * 7")), lambda r: text("set")]
        ) as server:
            result = agent_for(server, tmp_path, sandbox=sandbox).run("set a variable")
        assert result.ok and not sandbox.closed
        assert sandbox.run_python("answer").result["data"]["text/plain"] == "42"


def _container_ids(docker_engine, run_label: str) -> list:
    return docker_engine.containers.list(
        all=True, filters={"label": f"kernel-sandbox.test-run={run_label}"}
    )


@pytest.mark.orphans  # a killed owner, then gc
def test_an_agent_killed_mid_session_leaves_a_valid_notebook(docker_engine, tmp_path):
    run_label = uuid.uuid4().hex[:12]
    notebook = tmp_path / "killed.ipynb"
    script = textwrap.dedent(
        f"""
        import sys
        from kernel_sandbox.agent import Agent
        from kernel_sandbox.config import SandboxConfig
        labels = {{**{TEST_LABEL!r}, "kernel-sandbox.test-run": {run_label!r}}}
        agent = Agent(base_url=sys.argv[1], api_key="test", model="m",
                      config=SandboxConfig(image="kernel-sandbox:datascience", labels=labels))
        agent.run("work, then hang", notebook_path={str(notebook)!r})
        """
    )
    with ScriptedOpenAIServer(
        [
            tool_calls(py("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\ndf")),
            tool_calls(py("import matplotlib.pyplot as plt\nplt.plot(df['a'])\nplt.show()")),
            text("never sent", delay=120),  # the model stalls on the third request
        ]
    ) as server:
        proc = subprocess.Popen([sys.executable, "-c", script, server.base_url], cwd=ROOT)
        try:
            wait_for(lambda: len(server.chat_requests) >= 3, 120, 0.1, "the third model request")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
            orphans = _container_ids(docker_engine, run_label)
            # The killed process could not clean up: `kernel-sandbox gc` does, host files too.
            run_dirs = [Path(c.labels["kernel-sandbox.run-dir"]) for c in orphans]
            CliRunner().invoke(cli, ["gc"])
            assert not _container_ids(docker_engine, run_label)
            assert not [d for d in run_dirs if d.exists()]

    assert proc.returncode == -signal.SIGKILL
    assert len(orphans) == 1  # its sandbox, found by label
    nb = read(notebook)  # nbformat.validate accepts what the killed process left
    assert nb.metadata[META_KEY]["status"] == "running"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 2 and "text/html" in code[0].outputs[0]["data"]
    assert any("image/png" in o.get("data", {}) for o in code[1].outputs)
    assert not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob(".*"))


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1"},
    )


def _agent_cli(docker_engine, *args: str) -> subprocess.CompletedProcess:
    """``kernel-sandbox agent ...`` on labelled sandboxes; checks it removed its sandbox."""
    run_label = uuid.uuid4().hex[:12]
    labels = ("--label", "kernel-sandbox.test=1", "--label", f"kernel-sandbox.test-run={run_label}")
    try:
        return _cli("agent", *args, *labels)
    finally:
        left = _container_ids(docker_engine, run_label)
        for container in left:
            container.remove(force=True)
        assert not left, "kernel-sandbox agent left its sandbox running"


def test_the_agent_command_runs_a_session_and_writes_a_notebook(docker_engine, tmp_path):
    with ScriptedOpenAIServer(
        [
            tool_calls(
                py(LOAD_INLINE),
                content="Reading the data first.",
            ),
            tool_calls(py(PLOT)),
            lambda r: text(
                f"Sales total {r.tool_results()[-1]['output'].splitlines()[-1]}; see the plot."
            ),
        ]
    ) as server:
        done = _agent_cli(
            docker_engine,
            "Describe the sales and plot them",
            "--base-url", server.base_url,
            "--api-key", "test",
            "--model", "scripted-analyst",
            "--notebook-dir", str(tmp_path),
            "--max-turns", "5",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "[turn 1] 1 tool call" in out and "> python_executor" in out
    assert "Reading the data first." in out and "success" in out
    assert "answer:\nSales total 53; see the plot." in out
    path = Path(out.strip().splitlines()[-1].removeprefix("notebook: "))
    assert path.parent == tmp_path and path.suffix == ".ipynb"
    nb = read(path)
    assert nb.metadata[META_KEY]["model"] == "scripted-analyst"
    plot = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)

    html = _cli("export", str(path), "--to", "html")
    assert html.returncode == 0, html.stderr
    page = Path(html.stdout.strip()).read_text()
    assert "data:image/png;base64," in page and "Sales total 53" in page


def test_the_agent_command_reports_a_dead_endpoint_in_one_line(docker_engine, tmp_path):
    done = _agent_cli(
        docker_engine,
        "hello",
        "--base-url", "http://127.0.0.1:9/v1",
        "--api-key", "test",
        "--retries", "1",
        "--image", "kernel-sandbox:python",
        "--notebook-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(
        "error: the model API failed after 2 attempts: cannot connect to the model endpoint"
    )
    assert errors[0].endswith("check base_url and the network")
    assert "Traceback" not in done.stderr
    (path,) = tmp_path.glob("*.ipynb")
    assert read(path).metadata[META_KEY]["status"] == "failed"
