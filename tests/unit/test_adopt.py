"""Adoption and attaching, on LocalKernelHost; and the notebook's two writers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from kernel_sandbox.cli.attach import _record
from kernel_sandbox.errors import KernelError, SandboxNotFoundError
from kernel_sandbox.notebook import NotebookRecorder
from kernel_sandbox.notebook.cells import META_KEY
from kernel_sandbox.notebook.shared import append_cells, find_notebook
from kernel_sandbox.sandbox import AsyncSandbox
from tests.unit.conftest import NewSandbox
from tests.waiting import await_for


async def test_a_guest_shares_the_live_kernel_and_leaves_it_running(
    new_sandbox: NewSandbox,
) -> None:
    owner = await new_sandbox()
    await owner.run_python("x = 41")
    guest = await AsyncSandbox.adopt(owner.id, host="local", own=False)
    try:
        assert (await guest.run_python("y = x + 1; y")).text == "42"
        with pytest.raises(KernelError, match="guest"):
            await guest.restart()
    finally:
        await guest.close()
    assert (await owner.run_python("y")).text == "42"  # the guest left the kernel alone
    assert await owner.health() is None


async def test_the_local_host_adopts_nothing(new_sandbox: NewSandbox) -> None:
    owner = await new_sandbox()
    with pytest.raises(KernelError, match="only attaches as a guest"):
        await AsyncSandbox.adopt(owner.id, host="local")
    with pytest.raises(SandboxNotFoundError):
        await AsyncSandbox.adopt("nope", host="local", own=False)
    assert (await owner.run_python("1 + 1")).text == "2"


async def test_interrupt_is_public(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    marker = f"{sandbox.working_dir}/started"
    cell = asyncio.ensure_future(
        sandbox.run_python(f"import time\nopen({marker!r}, 'w').close()\ntime.sleep(60)")
    )
    await await_for(lambda: sandbox.files.exists(marker), 60, 0.02, "the cell to start")
    await sandbox.interrupt()
    result = await asyncio.wait_for(cell, 30)
    assert result.error is not None and result.error.ename == "KeyboardInterrupt"


async def test_recorder_keeps_cells_a_person_appended(
    new_sandbox: NewSandbox, tmp_path: Path
) -> None:
    sandbox = await new_sandbox()
    path = tmp_path / "s.ipynb"
    NotebookRecorder.attach(sandbox, path, title="t")
    assert find_notebook(sandbox.id) == path.resolve()
    await sandbox.run_python("a = 1")
    person = new_code_cell("b = 2", metadata={META_KEY: {"kind": "python", "by": "person"}})
    await asyncio.to_thread(append_cells, path, [person])
    await sandbox.run_python("c = 3")  # the recorder's rewrite merges the person's cell
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert sources == ["a = 1", "b = 2", "c = 3"]


def test_a_console_cell_is_recorded_with_its_outputs(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    recorder = NotebookRecorder(path)
    assert recorder.steps == 0

    def msg(kind: str, **content: object) -> dict[str, object]:
        return {"header": {"msg_type": kind}, "content": content, "metadata": {}}

    messages = [
        msg("execute_input", code="print(1); 1/0", execution_count=7),
        msg("stream", name="stdout", text="1\n"),
        msg("error", ename="ZeroDivisionError", evalue="division by zero", traceback=["tb"]),
    ]
    _record(path, "print(1); 1/0", messages, 0.0)
    cell = json.loads(path.read_text())["cells"][-1]
    assert cell["execution_count"] == 7
    assert cell["metadata"][META_KEY]["by"] == "person"
    assert cell["metadata"][META_KEY]["status"] == "error"
    assert [o["output_type"] for o in cell["outputs"]] == ["stream", "error"]
    nbformat.validate(nbformat.read(path, as_version=4))


def test_a_hostile_kernels_malformed_outputs_leave_the_persons_cell_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.ipynb"
    recorder = NotebookRecorder(path)

    def msg(kind: str, content: object) -> dict[str, object]:
        return {"header": {"msg_type": kind}, "content": content, "metadata": {}}

    messages = [
        msg("execute_input", {"code": "x", "execution_count": "7; rm"}),
        msg("display_data", {"data": ["a", "list"], "metadata": {}}),
        msg("execute_result", {"data": {"text/plain": 3}, "execution_count": 1}),
        msg("stream", ["no", "dict"]),
        msg("error", {"ename": "E", "evalue": "v", "traceback": "not a list"}),
        msg("stream", {"name": "stdout", "text": "kept\n"}),
    ]
    _record(path, "x", messages, 0.0)
    cell = json.loads(path.read_text())["cells"][-1]
    assert "".join(cell["source"]) == "x" and cell["execution_count"] is None
    assert ["".join(o["text"]) for o in cell["outputs"]] == ["kept\n"]
    nbformat.validate(nbformat.read(path, as_version=4))
    recorder.add_note("the recorder writes on after it")  # and does not raise
    assert "x" in [c.source for c in nbformat.read(path, as_version=4).cells]
