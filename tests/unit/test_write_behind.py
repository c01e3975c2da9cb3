"""Write-behind recording: steps cost no write, the file catches up within the delay,
flush/finish write at once, and a killed process leaves a valid notebook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat

from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.notebook.storage import read_notebook
from kernel_sandbox.notebook.writer import WRITER
from tests.waiting import wait_for


def _cells(path: Path) -> int:
    return len(read_notebook(path).cells)


def test_steps_are_written_behind_and_coalesced(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, title="t", flush_delay=30)
    assert _cells(path) == 1  # the file exists from the start
    writes = []
    real = rec.flush

    def counting() -> None:
        writes.append(1)
        real()

    rec.flush = counting  # type: ignore[method-assign]
    for i in range(50):
        rec.add_note(f"note {i}")
    assert _cells(path) == 1  # nothing written on the step path
    assert WRITER.pending() >= 1
    rec.flush()
    assert _cells(path) == 51
    assert len(writes) == 1  # fifty steps, one write


def test_the_writer_thread_writes_within_the_delay(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, flush_delay=0.05)
    rec.add_note("hello")
    wait_for(lambda: _cells(path) == 1, 30, 0.02, "the writer thread to write the note")
    assert read_notebook(path).cells[0].source == "hello"


def test_finish_writes_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, flush_delay=30)
    rec.add_note("last words")
    rec.finish("completed", "done")
    nb = read_notebook(path)
    assert nb.cells[-1].source == "last words"
    assert nb.metadata["kernel_sandbox"]["status"] == "completed"


def test_without_delay_every_step_is_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path)
    rec.add_note("a")
    assert _cells(path) == 1
    assert rec.flush_delay is None


def test_version_and_watchers_follow_every_change(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb", flush_delay=30)
    seen: list[int] = []
    rec.watch(lambda: seen.append(rec.version))
    before = rec.version
    rec.add_note("a")
    rec.add_user_message("b")
    assert rec.version == before + 2 and seen == [before + 1, before + 2]


def test_a_killed_process_leaves_a_valid_notebook(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    script = textwrap.dedent(
        f"""
        import sys, time
        from kernel_sandbox.notebook.recorder import NotebookRecorder
        rec = NotebookRecorder({str(path)!r}, flush_delay=0.01)
        for i in range(20):
            rec.add_note("x" * 2000 + str(i))
        print("going", flush=True)
        time.sleep(600)  # killed here, without finish() or a clean exit
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"going\n"
    wait_for(lambda: _cells(path) >= 20, 30, 0.01, "the writer to catch up")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert len(nb.cells) >= 20


def test_cells_someone_else_wrote_survive_later_writes(tmp_path: Path) -> None:
    """A write reads the file back only when someone else wrote it since; what it found
    there (an earlier session continued, a person's cells) stays in every later write."""
    from nbformat.v4 import new_code_cell

    from kernel_sandbox.notebook import shared

    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, title="t", flush_delay=30)
    rec.add_note("mine 1")
    rec.flush()
    shared.append_cells(path, [new_code_cell("theirs = 1")])
    rec.add_note("mine 2")
    rec.flush()  # reads theirs back
    rec.add_note("mine 3")
    rec.flush()  # the file is as it left it: not read again, theirs kept all the same
    sources = [c.source for c in read_notebook(path).cells]
    assert sources == ["# t", "mine 1", "theirs = 1", "mine 2", "mine 3"]
    assert [c.source for c in rec.notebook.cells] == sources
    nbformat.validate(read_notebook(path))
