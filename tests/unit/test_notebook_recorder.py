"""NotebookRecorder with canned results: valid after every step, atomic on disk, re-runnable."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from kernel_sandbox.events import FileOperated, PythonExecuted, ShellExecuted
from kernel_sandbox.notebook import META_KEY, NotebookRecorder, new_session_path
from kernel_sandbox.notebook.cells import split_magic
from kernel_sandbox.results import CommandResult, Execution
from tests.waiting import wait_for

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()


def canned_plot(count: int = 1) -> Execution:
    return Execution(
        "ok",
        [
            {"output_type": "stream", "name": "stdout", "text": "plotting\n"},
            {
                "output_type": "display_data",
                "data": {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
                "metadata": {},
            },
            {
                "output_type": "execute_result",
                "execution_count": count,
                "data": {"text/html": "<table></table>", "text/plain": "   a\n0  1"},
                "metadata": {},
            },
        ],
        execution_count=count,
        duration=0.25,
    )


def canned_error(count: int = 2) -> Execution:
    return Execution(
        "error",
        [
            {
                "output_type": "error",
                "ename": "ZeroDivisionError",
                "evalue": "division by zero",
                "traceback": ["ZeroDivisionError: division by zero"],
            }
        ],
        execution_count=count,
    )


def read(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


def test_every_step_leaves_a_valid_notebook_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, metadata={"model": "test-model"})
    assert read(path).cells == []  # the file exists, valid, from the start
    steps = [
        lambda: rec.add_user_message("Plot the data"),
        lambda: rec.add_python("plot()", canned_plot(1), {"tool_call_id": "call_1"}),
        lambda: rec.add_python("1/0", canned_error(2)),
        lambda: rec.add_shell("echo hi; exit 2", CommandResult(2, "hi\n", "boom\n")),
        lambda: rec.add_file_operation("write", "/sandbox/a.csv", content="a\n1\n"),
        lambda: rec.add_assistant_message("Here is the plot.", {"finish_reason": "stop"}),
    ]
    for n, step in enumerate(steps, 1):
        step()
        nb = read(path)
        assert len(nb.cells) == n
        assert nb.metadata[META_KEY]["steps"] == n
    rec.finish("completed", "answered")
    nb = read(path)
    meta = nb.metadata[META_KEY]
    assert (meta["status"], meta["reason"], meta["model"]) == (
        "completed",
        "answered",
        "test-model",
    )
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["language_info"]["name"] == "python"

    user, plot, err, shell, write, answer = nb.cells
    assert user.cell_type == "markdown" and "**User**" in user.source
    assert "Plot the data" in user.source
    assert plot.execution_count == 1 and plot.source == "plot()"
    assert [o.output_type for o in plot.outputs] == ["stream", "display_data", "execute_result"]
    assert plot.outputs[1].data["image/png"] == PNG
    assert plot.metadata[META_KEY]["tool_call_id"] == "call_1"
    assert plot.metadata[META_KEY]["status"] == "ok"
    assert err.outputs[0].ename == "ZeroDivisionError"
    assert err.metadata[META_KEY]["status"] == "error"
    assert shell.source.startswith("%%sh\n") and "echo hi; exit 2" in shell.source
    assert shell.metadata[META_KEY]["exit_code"] == 2
    assert [o.text for o in shell.outputs] == ["hi\n", "boom\n[exit status 2]\n"]
    assert write.cell_type == "code" and split_magic(write.source) == (
        "writefile",
        ["/sandbox/a.csv"],
        "a\n1\n",
    )
    assert "**Assistant**" in answer.source and answer.metadata[META_KEY]["role"] == "assistant"


def test_listener_records_sandbox_events_and_call_verdicts_merge(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")
    call = {"tool_call_id": "call_9", "tool": "python_executor"}
    rec(PythonExecuted("sb1", "plot()", canned_plot(3), time.time(), metadata=call))
    assert rec.finish_call("call_9", {"tool_status": "success"})
    assert not rec.finish_call("call_0", {"tool_status": "error"})  # never reached a cell
    rec(ShellExecuted("sb1", "ls", CommandResult(0, "a\n", ""), time.time(), cwd="/data"))
    rec(FileOperated("sb1", "read", "/sandbox/a.csv", time.time(), size=12))
    rec(FileOperated("sb1", "write", "/sandbox/b.bin", time.time(), size=9))
    rec(FileOperated("sb1", "delete", "/sandbox/old", time.time()))
    rec(FileOperated("sb1", "write", "/ro/x", time.time(), error="permission denied"))
    nb = read(rec.path)
    py, sh, rd, wr, rm, failed = nb.cells
    assert py.metadata[META_KEY]["tool_call_id"] == "call_9"
    assert py.metadata[META_KEY]["tool_status"] == "success"
    assert py.metadata[META_KEY]["sandbox_id"] == "sb1"
    assert sh.source == "%%sh\ncd /data\nls"
    assert rd.cell_type == "markdown" and "`read`" in rd.source and "/sandbox/a.csv" in rd.source
    assert wr.cell_type == "markdown" and "not recorded" in wr.source  # no content known
    assert rm.cell_type == "code" and rm.source == "%%sh\nrm -rf -- /sandbox/old"
    assert failed.cell_type == "markdown" and "permission denied" in failed.source


def test_timeout_gets_a_visible_note_and_binary_writes_are_described(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")
    rec.add_python(
        "while True: pass",
        Execution("timeout", [], 4, message="execution timed out after 1s and was interrupted"),
    )
    rec.add_file_operation("write", "/sandbox/blob", content=b"\xff\xfe\x00")
    rec.add_file_operation("append", "/sandbox/log.txt", content="more\n")
    cells = read(rec.path).cells
    assert cells[0].metadata[META_KEY]["status"] == "timeout"
    assert cells[1].cell_type == "markdown" and "timed out after 1s" in cells[1].source
    assert cells[2].cell_type == "markdown" and "(3 B)" in cells[2].source
    assert cells[3].source == "%%writefile -a /sandbox/log.txt\nmore\n"


def test_outputs_nbformat_rejects_are_replaced_not_fatal(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")
    bad = Execution("ok", [{"output_type": "stream", "name": "stdout"}], 1)  # no "text"
    rec.add_python("print()", bad)
    cell = read(rec.path).cells[0]
    assert cell.outputs[0].name == "stderr" and "not recordable" in cell.outputs[0].text


def test_metadata_that_is_not_json_is_stringified(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")
    rec.set_metadata(model="m", started=Path("/x"), budget={"turns": 5})
    meta = read(rec.path).metadata[META_KEY]
    assert (meta["model"], meta["started"], meta["budget"]) == ("m", "/x", {"turns": 5})


def test_failed_write_keeps_the_previous_notebook_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path)
    rec.add_user_message("first")
    before = path.read_text()

    def crash(*args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        rec.add_user_message("second")
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.ipynb"]


def test_session_paths_are_unique_and_sortable(tmp_path: Path) -> None:
    a, b = new_session_path(tmp_path), new_session_path(tmp_path)
    assert a != b and a.parent == tmp_path and a.suffix == ".ipynb"
    assert a.name.startswith("session-2") and len(a.name.split("-")) == 4


_CHILD = textwrap.dedent(
    """
    import base64, sys
    from kernel_sandbox.notebook import NotebookRecorder
    from kernel_sandbox.results import Execution

    rec = NotebookRecorder(sys.argv[1])
    big = base64.b64encode(bytes(range(256)) * 4096).decode()  # 1 MiB image per cell
    n = 0
    while True:
        n += 1
        out = {"output_type": "display_data", "data": {"image/png": big}, "metadata": {}}
        rec.add_python(f"step({n})", Execution("ok", [out], n))
    """
)


@pytest.mark.parametrize("min_steps", [2, 5, 9])
def test_kill_9_while_recording_leaves_a_valid_notebook(tmp_path: Path, min_steps: int) -> None:
    path = tmp_path / "s.ipynb"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)])

    def recorded() -> bool:
        assert child.poll() is None, "the recording process died by itself"
        try:
            steps = json.loads(path.read_text())["metadata"][META_KEY].get("steps", 0)
        except (FileNotFoundError, ValueError, KeyError):
            steps = 0  # not there yet; a partial file would be a failure below
        return bool(steps >= min_steps)

    try:
        wait_for(recorded, 120, 0.05, f"the recorder to reach {min_steps} steps")
        child.send_signal(signal.SIGKILL)  # most likely in the middle of the next write
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    nb = read(path)
    assert len(nb.cells) >= min_steps
    assert [c.source for c in nb.cells] == [f"step({n})" for n in range(1, len(nb.cells) + 1)]


def test_hand_made_outputs_missing_optional_fields_are_completed(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")
    outputs = [
        {"output_type": "display_data", "data": {"image/png": PNG}},
        {"output_type": "execute_result", "data": {"text/plain": "1"}},
    ]
    rec.add_python("x", Execution("ok", outputs, 5))
    cell = read(rec.path).cells[0]
    assert cell.outputs[0].data["image/png"] == PNG
    assert cell.outputs[1].execution_count == 5


def test_notebooks_recorded_with_remove_still_redo_it(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")
    rec.add_file_operation("remove", "/sandbox/old")  # the name used before "delete"
    assert read(rec.path).cells[0].source == "%%sh\nrm -rf -- /sandbox/old"
