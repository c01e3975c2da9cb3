"""Several writers of one notebook (kernel_sandbox/notebook/shared.py): every process's
cells kept once and in its order, whatever the interleaving; a notebook's lock holds up
only the writers of that notebook."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell

from kernel_sandbox.notebook import shared
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.notebook.storage import read_notebook

ROOT = Path(__file__).resolve().parents[2]


def _sources(path: Path) -> list[str]:
    return [cell.source for cell in read_notebook(path).cells]


def test_processes_writing_one_notebook_at_once_lose_nothing(tmp_path: Path) -> None:
    """Two recorders (two server workers' copies of one sandbox) and a person's console,
    each in a process of its own, all writing the same notebook as fast as they can."""
    path = tmp_path / "s.ipynb"
    NotebookRecorder(path, title="t")
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from nbformat.v4 import new_code_cell
        from kernel_sandbox.notebook import shared
        from kernel_sandbox.notebook.recorder import NotebookRecorder

        path, who, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()  # all start together
        if who == "person":
            for i in range(n):
                shared.append_cells(path, [new_code_cell(f"{who} {i}")])
        else:
            rec = NotebookRecorder(path, flush_delay=30)
            for i in range(n):
                rec.add_note(f"{who} {i}")
                rec.flush()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    n, writers = 40, ("a", "b", "person")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), who, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        for who in writers
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
    assert [proc.wait(120) for proc in procs] == [0, 0, 0]

    sources = _sources(path)
    assert sources[0] == "# t"
    for who in writers:
        assert [s for s in sources if s.startswith(f"{who} ")] == [f"{who} {i}" for i in range(n)]
    assert len(sources) == 1 + n * len(writers)
    nbformat.validate(read_notebook(path))


def test_calls_alternating_between_two_writers_stay_in_call_order(tmp_path: Path) -> None:
    """A sandbox's calls landing on one worker, then the other (each writes its cell
    before the next call starts, as the call lock makes them): the notebook is in call
    order, and each writer's own copy becomes the whole notebook."""
    path = tmp_path / "s.ipynb"
    first = NotebookRecorder(path, title="t", flush_delay=30)
    second = NotebookRecorder(path, flush_delay=30)
    order = []
    for i in range(12):
        writer = (first, second)[(i // 2 + i) % 2]  # a, b, b, a, a, b, ...
        writer.add_note(f"call {i}")
        writer.flush()
        order.append(f"call {i}")
    assert _sources(path) == ["# t", *order]
    first.add_note("last")
    first.flush()
    assert [cell.source for cell in first.notebook.cells] == ["# t", *order, "last"]
    nbformat.validate(read_notebook(path))


def test_a_cell_written_by_hand_that_is_not_valid_leaves_the_others(tmp_path: Path) -> None:
    """Someone else's cells are merged one by one: a broken one is left out, the valid
    ones beside it stay (the file is never replaced without them)."""
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, title="t", flush_delay=30)
    rec.add_note("mine 1")
    rec.flush()
    shared.append_cells(path, [new_code_cell("theirs = 1")])
    data = json.loads(path.read_text())
    broken = new_markdown_cell("broken")
    broken["outputs"] = "not a markdown cell's"
    data["cells"].insert(2, dict(broken))
    path.write_text(json.dumps(data))  # as a person's editor would, in place
    rec.add_note("mine 2")
    rec.flush()
    assert _sources(path) == ["# t", "mine 1", "theirs = 1", "mine 2"]
    nbformat.validate(read_notebook(path))


def test_a_notebooks_lock_does_not_hold_up_its_neighbours(tmp_path: Path) -> None:
    """Sandboxes of one key share a directory: while one notebook's write lock is held,
    another's writes go on; the held one's wait until it is let go."""
    held, other = NotebookRecorder(tmp_path / "a.ipynb"), NotebookRecorder(tmp_path / "b.ipynb")
    wrote = {name: threading.Event() for name in ("held", "other")}

    def write(rec: NotebookRecorder, name: str) -> None:
        rec.add_note(name)
        wrote[name].set()

    with shared.locked(held.path):
        threads = [
            threading.Thread(target=write, args=(rec, name))
            for rec, name in ((held, "held"), (other, "other"))
        ]
        for thread in threads:
            thread.start()
        assert wrote["other"].wait(60), "the neighbour's write waited for another's lock"
        assert not wrote["held"].is_set()
    for thread in threads:
        thread.join(60)
    assert wrote["held"].is_set()
    assert _sources(held.path) == ["held"] and _sources(other.path) == ["other"]


def test_a_notebook_made_by_two_writers_at_once_is_made_once(tmp_path: Path) -> None:
    """No file yet: the writers take turns on the directory, and the second one finds
    the first one's notebook and merges into it."""
    path = tmp_path / "new" / "s.ipynb"
    recorders: list[NotebookRecorder] = []
    barrier = threading.Barrier(4)

    def make(i: int) -> None:
        barrier.wait()
        rec = NotebookRecorder(path, flush_delay=30)
        rec.add_note(f"w{i}")
        rec.flush()
        recorders.append(rec)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(_sources(path)) == ["w0", "w1", "w2", "w3"]


def test_a_turn_taken_puts_the_takers_cells_before_any_later_write(tmp_path: Path) -> None:
    """A server call takes the notebook's turn before it lets the next call run, and
    writes its cell after answering: the next call's cell, written by another process
    meanwhile, waits for it and comes after it."""
    path = tmp_path / "s.ipynb"
    first = NotebookRecorder(path, title="t", flush_delay=30)
    second = NotebookRecorder(path, flush_delay=30)
    first.add_note("call 1")
    first.take_turn()
    # the notebook's lock is held, for every process
    with open(path) as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    second.add_note("call 2")
    writing = threading.Thread(target=second.flush)
    writing.start()
    first.flush_turn()
    writing.join(60)
    assert _sources(path) == ["# t", "call 1", "call 2"]
    first.add_note("call 3")
    first.flush()
    assert _sources(path) == ["# t", "call 1", "call 2", "call 3"]


def test_a_turn_is_for_a_notebook_written_behind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_delay"):
        NotebookRecorder(tmp_path / "s.ipynb").take_turn()
