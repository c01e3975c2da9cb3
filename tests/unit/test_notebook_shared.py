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

from kernel_sandbox.errors import NotebookError
from kernel_sandbox.notebook import shared
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.notebook.storage import read_notebook
from tests.waiting import wait_for

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
    n, writers = 40, ("a", "b", "person")
    procs = _started(script, *([str(path), who, str(n)] for who in writers))
    for proc in procs:
        assert proc.stdin is not None
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


# -- a turn kept between calls (server workers: NotebookFile.keep_turn) ---------------

NEVER = 3600.0  # a flush delay no test waits for: only a hand-over lets a kept turn go


def test_a_kept_turn_coalesces_and_is_handed_over_to_a_writer_that_wants_it(
    tmp_path: Path,
) -> None:
    """A worker's calls keep the turn: nothing is written per call; another writer that
    wants the notebook pokes, and gets it once the keeper's cells are written."""
    path = tmp_path / "s.ipynb"
    first = NotebookRecorder(path, title="t", flush_delay=NEVER)
    second = NotebookRecorder(path, flush_delay=NEVER)
    for i in range(3):
        first.add_note(f"call {i}")
        first.keep_turn()
        assert first.keeps_turn
    assert _sources(path) == ["# t"]  # coalesced: not written yet
    assert shared.turn_path(path).is_fifo()
    second.add_note("call 3")
    writing = threading.Thread(target=second.flush, daemon=True)
    writing.start()
    writing.join(60)
    assert not writing.is_alive(), "the kept turn was not handed over"
    assert not first.keeps_turn
    assert _sources(path) == ["# t", "call 0", "call 1", "call 2", "call 3"]
    first.add_note("call 4")
    first.keep_turn()
    first.flush()  # nothing left to write: let go
    assert not first.keeps_turn
    assert _sources(path) == ["# t", "call 0", "call 1", "call 2", "call 3", "call 4"]


def test_a_kept_turn_stays_kept_through_its_writes_until_one_finds_nothing(
    tmp_path: Path,
) -> None:
    """The write behind writes a kept turn's cells and keeps it: the file that now has
    the notebook's name is locked too (a newcomer must not find it free), until a visit
    with nothing to write lets go."""
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, title="t", flush_delay=NEVER)
    for i in range(2):
        rec.add_note(f"call {i}")
        rec.keep_turn()
        rec._file.write_behind()  # what the writer thread does within the delay
        assert rec.keeps_turn
        assert _sources(path) == ["# t", *(f"call {j}" for j in range(i + 1))]
        with open(path) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    rec._file.write_behind()  # nothing new: let go
    assert not rec.keeps_turn
    with open(path) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_kept_turn_is_let_go_by_the_write_behind(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path, title="t", flush_delay=0.05)
    rec.add_note("call 0")
    rec.keep_turn()
    # one visit writes, the next finds nothing: lets go
    wait_for(lambda: not rec.keeps_turn, 60, 0.01, "the write behind to let the turn go")
    assert _sources(path) == ["# t", "call 0"]
    with open(path) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


_WORKER = textwrap.dedent(
    """
    import fcntl, os, sys
    from pathlib import Path
    from kernel_sandbox.notebook.recorder import NotebookRecorder

    path, calls, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    rec = NotebookRecorder(path, flush_delay=3600)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    with open(calls, "r+") as lock:
        for _ in range(n):
            fcntl.flock(lock, fcntl.LOCK_EX)  # the sandbox's call lock
            lock.seek(0)
            i = int(lock.read() or 0)
            lock.seek(0); lock.truncate(); lock.write(str(i + 1)); lock.flush()
            rec.add_note(f"call {i}")
            rec.keep_turn()  # before the call lock goes, as the server does
            fcntl.flock(lock, fcntl.LOCK_UN)
    rec.flush()
    if len(sys.argv) > 4:
        rec.add_note("pending")
        rec.keep_turn()
        sys.stdout.write("kept\\n"); sys.stdout.flush()
        sys.stdin.read()
    """
)


def _started(script: str, *args: list[str]) -> list[subprocess.Popen[bytes]]:
    """A process of ``script`` for each argument list, all told to go once all are ready."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *arg],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        for arg in args
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    return procs


def _workers(*args: list[str]) -> list[subprocess.Popen[bytes]]:
    return _started(_WORKER, *args)


def test_workers_keeping_turns_write_every_call_once_in_call_order(tmp_path: Path) -> None:
    """Two processes take a sandbox's calls in whatever order their call lock gives, each
    keeping the turn after its call (a flush delay never reached): the notebook has every
    call once, in the order the calls ran."""
    path, calls = tmp_path / "s.ipynb", tmp_path / "calls"
    NotebookRecorder(path, title="t")
    calls.write_text("0")
    n = 60
    procs = _workers([str(path), str(calls), str(n)], [str(path), str(calls), str(n)])
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
    assert [proc.wait(120) for proc in procs] == [0, 0]
    assert _sources(path) == ["# t", *(f"call {i}" for i in range(2 * n))]
    nbformat.validate(read_notebook(path))


_PERSON = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from nbformat.v4 import new_markdown_cell
    from kernel_sandbox.notebook import shared

    path, stop = Path(sys.argv[1]), Path(sys.argv[2])
    made = 0
    while not stop.exists():
        shared.append_cells(path, [new_markdown_cell(f"person {made}")])
        made += 1
    sys.stdout.write(f"{made}\\n")
    """
)


def test_workers_keeping_turns_keep_call_order_while_another_writer_pokes(
    tmp_path: Path,
) -> None:
    """Two workers take a sandbox's calls, keeping the turn, while a person's console
    appends cells as fast as it can: every poke hands a kept turn over while the
    keeper's next calls record, and still every call is once in the notebook, in the
    order the calls ran (a call that finds the turn kept has its cells written under it)."""
    path, calls, stop = tmp_path / "s.ipynb", tmp_path / "calls", tmp_path / "stop"
    NotebookRecorder(path, title="t")
    calls.write_text("0")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    person = subprocess.Popen(
        [sys.executable, "-c", _PERSON, str(path), str(stop)], stdout=subprocess.PIPE, env=env
    )
    n = 100
    try:
        procs = _workers([str(path), str(calls), str(n)], [str(path), str(calls), str(n)])
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        assert [proc.wait(120) for proc in procs] == [0, 0]
    finally:
        stop.touch()
        assert person.wait(60) == 0
    assert person.stdout is not None
    appended = int(person.stdout.read())
    sources = _sources(path)
    assert [s for s in sources if s.startswith("call ")] == [f"call {i}" for i in range(2 * n)]
    assert [s for s in sources if s.startswith("person ")] == [
        f"person {i}" for i in range(appended)
    ]


def test_a_worker_killed_keeping_the_turn_holds_up_nobody(tmp_path: Path) -> None:
    """Killed while it keeps the turn, its pending cell is lost (as any write behind's),
    and the other writers go on: the lock and the FIFO's reader die with it."""
    path, calls = tmp_path / "s.ipynb", tmp_path / "calls"
    NotebookRecorder(path, title="t")
    calls.write_text("0")
    (proc,) = _workers([str(path), str(calls), "2", "keep"])
    assert proc.stdout is not None and proc.stdout.readline() == b"kept\n"
    with open(path) as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # kept
    proc.kill()
    proc.wait(60)
    rec = NotebookRecorder(path, flush_delay=NEVER)
    rec.add_note("after")
    rec.flush()
    assert _sources(path) == ["# t", "call 0", "call 1", "after"]


def test_settling_writes_what_another_process_keeps(tmp_path: Path) -> None:
    """GET notebook settles: a cell another worker keeps unwritten is on disk after."""
    path, calls = tmp_path / "s.ipynb", tmp_path / "calls"
    reader = NotebookRecorder(path, title="t", flush_delay=NEVER)
    calls.write_text("0")
    (proc,) = _workers([str(path), str(calls), "1", "keep"])
    assert proc.stdout is not None and proc.stdout.readline() == b"kept\n"
    assert _sources(path) == ["# t", "call 0"]
    reader.settle()
    assert _sources(path) == ["# t", "call 0", "pending"]
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(60) == 0


_BUSY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from kernel_sandbox.notebook.recorder import NotebookRecorder

    path, stop = Path(sys.argv[1]), Path(sys.argv[2])
    rec = NotebookRecorder(path, flush_delay=3600)
    made = 0
    while not stop.exists() and made < 50_000:  # calls faster than writes
        rec.add_note(f"call {made}")
        rec.keep_turn()  # as a worker's call does before its call lock goes
        made += 1
        if made == 1:
            sys.stdout.write("kept\\n"); sys.stdout.flush()
    rec.flush()
    sys.stdout.write(f"{made}\\n")
    """
)


@pytest.mark.parametrize("waiter", ["settle", "append_cells", "write behind"])
def test_a_writer_waits_for_a_turn_kept_by_a_busy_worker_about_one_write(
    tmp_path: Path, waiter: str
) -> None:
    """A worker keeps the turn while its calls go on recording faster than it writes, never
    idle: GET notebook's settle, a person's console and another worker's write behind
    each get the notebook while it is still recording (the keeper writes what it holds
    and lets go; its next calls take the turn again), and the calls' cells stay in call
    order."""
    path, stop = tmp_path / "s.ipynb", tmp_path / "stop"
    other = NotebookRecorder(path, title="t", flush_delay=NEVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    keeper = subprocess.Popen(
        [sys.executable, "-c", _BUSY, str(path), str(stop)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert keeper.stdout is not None and keeper.stdout.readline() == b"kept\n"
        if waiter == "settle":
            wait = other.settle
        elif waiter == "append_cells":
            wait = lambda: shared.append_cells(path, [new_markdown_cell("person")])  # noqa: E731
        else:
            other.add_note("other worker")
            wait = other._file.write_behind  # what its writer thread does
        waiting = threading.Thread(target=wait, daemon=True)
        waiting.start()
        waiting.join(60)
        assert not waiting.is_alive(), "the writer waited for the keeper's calls to stop"
        assert keeper.poll() is None, "the writer waited for the keeper's calls to stop"
    finally:
        stop.touch()
        assert keeper.wait(60) == 0
    made = int(keeper.stdout.readline())
    sources = _sources(path)
    assert [s for s in sources if s.startswith("call ")] == [f"call {i}" for i in range(made)]
    assert sources[0] == "# t" and len(sources) == 1 + made + (waiter != "settle")


def _kept_elsewhere(path: Path) -> int:
    """The notebook at ``path`` locked by a keeper that cannot hear a poke (one on another
    host: the turn FIFO is there, no reader of it on this host); its descriptor."""
    rec = NotebookRecorder(path, title="t", flush_delay=NEVER)
    rec.flush()
    os.mkfifo(shared.turn_path(path), 0o600)
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_writer_gives_up_on_a_turn_kept_where_no_poke_is_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas told to keep turns on a volume shared across hosts: a writer waits
    NOTEBOOK_TURN_WAIT_SECONDS for the keeper, then raises NotebookError saying why
    (its cells come with a later write) instead of waiting while the keeper's calls go on."""
    path = tmp_path / "s.ipynb"
    keeper = _kept_elsewhere(path)
    monkeypatch.setattr(shared, "NOTEBOOK_TURN_WAIT_SECONDS", 0.3)
    failed: list[BaseException] = []

    def settle() -> None:
        try:
            NotebookRecorder(path, flush_delay=NEVER).settle()
        except BaseException as exc:
            failed.append(exc)

    try:
        waiting = threading.Thread(target=settle, daemon=True)
        waiting.start()
        waiting.join(60)
        assert not waiting.is_alive(), "the writer waited for a keeper nobody can tell"
    finally:
        os.close(keeper)
    (exc,) = failed
    assert isinstance(exc, NotebookError) and "--no-keep-notebook-turns" in str(exc)


def test_a_writer_gets_a_turn_kept_where_no_poke_is_heard_once_let_go(tmp_path: Path) -> None:
    """The same keeper letting go by itself (its calls stopped, its write behind found
    nothing more): the waiting writer, which tries the lock again, gets it and writes."""
    path = tmp_path / "s.ipynb"
    keeper = _kept_elsewhere(path)
    poked = os.open(shared.turn_path(path), os.O_RDONLY | os.O_NONBLOCK)
    waiting = threading.Thread(
        target=shared.append_cells, args=(path, [new_markdown_cell("person")]), daemon=True
    )
    try:
        waiting.start()

        def heard() -> bool:  # the waiter poked: it waits for the lock now
            try:
                return bool(os.read(poked, 4096))
            except BlockingIOError:
                return False

        wait_for(heard, timeout=30)
        assert waiting.is_alive()
    finally:
        os.close(keeper)
        os.close(poked)
    waiting.join(60)
    assert not waiting.is_alive()
    assert _sources(path) == ["# t", "person"]
