"""The sandbox emits every event itself, tagged with the caller's context; the recorder
only listens.  Real AsyncSandbox, tools and recorder on LocalKernelHost."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from kernel_sandbox.events import Event, FileOperated, KernelRestarted, call_context
from kernel_sandbox.notebook import META_KEY, NotebookRecorder, areplay
from kernel_sandbox.tools import ToolSet
from tests.unit.conftest import NewSandbox


async def test_direct_and_tool_file_calls_are_recorded_and_replayable(
    new_sandbox: NewSandbox, tmp_path: Path
) -> None:
    sandbox = await new_sandbox()
    recorder = NotebookRecorder.attach(sandbox, tmp_path / "s.ipynb")
    tools = ToolSet(sandbox)
    await sandbox.files.write("direct.txt", "by hand\n")  # no tool: still a cell
    with call_context(tool_call_id="c1"):
        await tools.execute(
            "file_operation", {"operation": "write", "file_path": "gone.txt", "content": "x"}
        )
    with call_context(tool_call_id="c2"):
        deleted = await tools.execute(
            "file_operation", {"operation": "delete", "file_path": "gone.txt"}
        )
    assert deleted.ok
    recorder.finish()
    recorder.detach(sandbox)
    cells = nbformat.read(recorder.path, as_version=4).cells
    direct, write, delete = (c for c in cells if c.cell_type == "code")
    assert direct.source == f"%%writefile {sandbox.working_dir}/direct.txt\nby hand\n"
    assert "tool_call_id" not in direct.metadata[META_KEY]
    assert write.metadata[META_KEY]["tool_call_id"] == "c1"
    assert write.metadata[META_KEY]["tool"] == "file_operation"
    assert delete.source == f"%%sh\nrm -rf -- {sandbox.working_dir}/gone.txt"
    assert delete.metadata[META_KEY]["tool_call_id"] == "c2"

    # replay in the same sandbox redoes the delete: the file is gone again afterwards
    await sandbox.files.write("gone.txt", "back")
    report = await areplay(recorder.path, sandbox=sandbox, output=tmp_path / "r.ipynb")
    assert [c.verdict for c in report.cells] == ["same", "same", "same"]
    assert not await sandbox.files.exists("gone.txt")


async def test_restarts_are_events_after_the_call_that_caused_them(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    events: list[Event] = []
    sandbox.listeners.append(events.append)
    with call_context(tool_call_id="x"):
        died = await sandbox.run_python("import os; os._exit(4)")
    assert died.status == "kernel_died" and died.state_lost
    await sandbox.restart()
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["PythonExecuted", "KernelRestarted", "KernelRestarted"]
    automatic, asked = events[1], events[2]
    assert isinstance(automatic, KernelRestarted) and isinstance(asked, KernelRestarted)
    assert (automatic.requested, automatic.metadata) == (False, {"tool_call_id": "x"})
    assert (asked.requested, asked.whole, asked.metadata) == (True, False, {})
    assert (await sandbox.run_python("print('fresh')")).text == "fresh"


async def test_a_failed_file_operation_is_an_event_with_its_error(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    events: list[Event] = []
    sandbox.listeners.append(events.append)
    with pytest.raises(FileNotFoundError):
        await sandbox.files.read("missing.txt")
    (event,) = events
    assert isinstance(event, FileOperated)
    assert event.operation == "read" and event.error.startswith("no such file")
