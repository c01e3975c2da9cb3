"""The tools against a real sandbox: one test per tool behaviour a model relies on.

One sandbox (the small python image) serves the whole module; tests use their own
variable names and paths so they do not depend on each other's state.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import nbformat
import pytest
import pytest_asyncio

from kernel_sandbox.events import Event, FileOperated, PythonExecuted, ShellExecuted
from kernel_sandbox.notebook import NotebookRecorder
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet
from tests.conftest import TEST_LABEL
from tests.integration.conftest import PYTHON_IMAGE

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def box(docker_engine: object) -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create(image=PYTHON_IMAGE, labels=TEST_LABEL)
    try:
        yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture
def tools(box: AsyncSandbox) -> ToolSet:
    return ToolSet(box)


async def test_python_executor_keeps_state_across_calls(tools: ToolSet) -> None:
    first = await tools.execute(
        "python_executor",
        {"code": "import math\nradius = 2\ndef area(r):\n    return math.pi * r**2"},
    )
    assert first.status == "success", first.error
    second = await tools.execute("python_executor", '{"code": "round(area(radius), 3)"}')
    assert second.status == "success"
    assert second.output == "12.566"
    assert second.metadata["execution_count"] > first.metadata["execution_count"]
    assert second.metadata["state_lost"] is False


async def test_python_error_comes_back_with_traceback_and_the_kernel_goes_on(
    tools: ToolSet,
) -> None:
    failed = await tools.execute("python_executor", {"code": "values = [1, 2]\nvalues[5]"})
    assert failed.status == "error"
    assert failed.error == "IndexError: list index out of range"
    assert "values[5]" in failed.output  # the traceback shows the failing line
    assert "\x1b[" not in failed.output  # no terminal colours for the model
    fixed = await tools.execute("python_executor", {"code": "values[-1]"})
    assert (fixed.status, fixed.output) == ("success", "2")


async def test_python_timeout_interrupts_and_keeps_variables(tools: ToolSet) -> None:
    await tools.execute("python_executor", {"code": "kept = 'still here'"})
    slow = await tools.execute(
        "python_executor", {"code": "import time\ntime.sleep(60)", "timeout": 1}
    )
    assert slow.status == "timeout"
    assert "interrupted" in (slow.error or "")
    assert slow.metadata["state_lost"] is False
    after = await tools.execute("python_executor", {"code": "kept"})
    assert after.output == "'still here'"


async def test_shell_executor_reports_output_exit_code_and_cwd(tools: ToolSet) -> None:
    ok = await tools.execute("shell_executor", {"command": "mkdir -p work && cd work && pwd"})
    assert (ok.status, ok.output, ok.metadata["exit_code"]) == ("success", "/sandbox/work", 0)
    in_dir = await tools.execute(
        "shell_executor", {"command": "pwd; id -un", "cwd": "work", "timeout": None}
    )
    assert in_dir.output == "/sandbox/work\nsandbox"
    failed = await tools.execute("shell_executor", {"command": "echo partial; ls /nope"})
    assert failed.status == "error"
    assert failed.metadata["exit_code"] == 2
    assert failed.output.startswith("partial\n[stderr]\n")
    assert "/nope" in failed.output


async def test_shell_timeout_kills_the_command(tools: ToolSet) -> None:
    result = await tools.execute("shell_executor", {"command": "sleep 60", "timeout": 1})
    assert result.status == "timeout"
    assert result.error == "the command timed out after 1 s and was killed"
    assert result.metadata["timed_out"] is True


async def test_shell_cwd_that_does_not_exist(tools: ToolSet) -> None:
    result = await tools.execute("shell_executor", {"command": "ls", "cwd": "/no/such/dir"})
    assert result.status == "error"
    assert result.error is not None
    assert result.error.startswith("the directory /no/such/dir does not exist")


async def test_file_operation_round_trip(tools: ToolSet) -> None:
    def call(**args: object) -> str:
        return json.dumps({"content": None, "encoding": None, **args})

    run = tools.execute
    write = await run(
        "file_operation", call(operation="write", file_path="fo/a.txt", content="ä\n")
    )
    assert write.output == "wrote 3 B to /sandbox/fo/a.txt"
    await run("file_operation", call(operation="append", file_path="fo/a.txt", content="b\n"))
    read = await run("file_operation", call(operation="read", file_path="/sandbox/fo/a.txt"))
    assert (read.status, read.output) == ("success", "ä\nb\n")
    latin = await run(
        "file_operation", call(operation="read", file_path="fo/a.txt", encoding="latin-1")
    )
    assert latin.output == "Ã¤\nb\n"
    assert (await run("file_operation", call(operation="mkdir", file_path="fo/sub/deeper"))).ok
    listing = await run("file_operation", call(operation="list", file_path="fo"))
    assert listing.output.splitlines() == [
        "/sandbox/fo (2 entries)",
        "a.txt  5 B",
        "sub/   directory",
    ]
    exists = await run("file_operation", call(operation="exists", file_path="fo/sub"))
    assert exists.metadata["exists"] is True
    assert (await run("file_operation", call(operation="delete", file_path="fo"))).ok
    gone = await run("file_operation", call(operation="exists", file_path="fo/a.txt"))
    assert gone.output == "/sandbox/fo/a.txt does not exist"


async def test_file_operation_on_a_missing_path(tools: ToolSet) -> None:
    for operation in ("read", "list", "delete"):
        result = await tools.execute(
            "file_operation", {"operation": operation, "file_path": "missing/thing"}
        )
        assert result.status == "error", operation
        assert result.error == (
            "no such file or directory in the sandbox: /sandbox/missing/thing; "
            "use operation 'list' on its parent directory to see what exists"
        )


async def test_files_are_shared_between_the_three_tools(tools: ToolSet) -> None:
    await tools.execute(
        "file_operation", {"operation": "write", "file_path": "shared.csv", "content": "a,b\n1,2\n"}
    )
    py = await tools.execute(
        "python_executor", {"code": "open('shared.csv').read().splitlines()[1]"}
    )
    assert py.output == "'1,2'"
    sh = await tools.execute("shell_executor", {"command": "wc -l < shared.csv"})
    assert sh.output == "2"


async def test_every_call_reaches_the_sandbox_listeners(box: AsyncSandbox, tools: ToolSet) -> None:
    events: list[Event] = []
    box.listeners.append(events.append)
    try:
        await tools.execute("python_executor", {"code": "1 + 1"})
        await tools.execute("shell_executor", {"command": "true"})
        await tools.execute(
            "file_operation", {"operation": "write", "file_path": "ev.txt", "content": "x"}
        )
    finally:
        box.listeners.remove(events.append)
    assert [type(e) for e in events] == [PythonExecuted, ShellExecuted, FileOperated]
    written = events[2]
    assert isinstance(written, FileOperated)
    assert (written.operation, written.path, written.size, written.content) == (
        "write",
        "/sandbox/ev.txt",
        1,
        b"x",
    )
    assert written.metadata["tool"] == "file_operation"


async def test_a_notebook_recorder_can_redo_file_writes(
    box: AsyncSandbox, tools: ToolSet, tmp_path: Path
) -> None:
    recorder = NotebookRecorder.attach(box, tmp_path / "session.ipynb")
    try:
        await tools.execute(
            "file_operation",
            {"operation": "write", "file_path": "rec/data.csv", "content": "a,b\n1,2\n"},
        )
        await tools.execute("python_executor", {"code": "open('rec/data.csv').read().count(',')"})
    finally:
        recorder.finish()
        box.listeners.remove(recorder)
    notebook = nbformat.read(tmp_path / "session.ipynb", as_version=4)
    nbformat.validate(notebook)
    sources = [c.source for c in notebook.cells if c.cell_type == "code"]
    assert sources[0].startswith("%%writefile ") and sources[0].endswith("a,b\n1,2\n")
    assert "rec/data.csv" in sources[0]
    assert sources[1] == "open('rec/data.csv').read().count(',')"


async def test_a_closed_sandbox_gives_error_results(docker_engine: object) -> None:
    sandbox = await AsyncSandbox.create(image=PYTHON_IMAGE, labels=TEST_LABEL)
    tools = ToolSet(sandbox)
    await sandbox.close()
    for name, args in [
        ("python_executor", {"code": "1"}),
        ("shell_executor", {"command": "true"}),
        ("file_operation", {"operation": "list", "file_path": "."}),
    ]:
        result = await tools.execute(name, args)
        assert result.status == "error", name
        assert "no longer running" in (result.error or "") or "not running" in (result.error or "")
