"""A session notebook written by more than one process: its recorder and people attached.

The sandbox's :class:`~kernel_sandbox.notebook.NotebookRecorder` rewrites its notebook
atomically after every step, from the cells it holds in memory.  A person attached to
the same kernel (``kernel-sandbox attach``) records their cells into the same file, and
with several server workers or replicas every process that serves the sandbox does.
Writers stay safe by one rule: every write happens under an exclusive ``flock`` on the
notebook and starts from what is on disk, so no writer ever drops a cell it did not
make.  The person's console appends its cells to the file as it is (a
read-append-replace under the lock); the recorder, before each rewrite, merges in the
cells on disk it does not hold (by cell id, in their place).  Each write is still an
atomic replace, so a reader (or a crash) never sees half a notebook.

The lock is the notebook file itself (no lock file is left beside a user's notebook):
a writer locks the file the path names, and goes on only if the path still names that
file once it holds the lock (a writer before it may have replaced it); a notebook not
written yet is created under a ``flock`` on its directory.  So writes of different
notebooks never wait for each other, whichever directory they share.

A server worker may *keep* the lock between its calls (the notebook's writing turn,
:meth:`NotebookFile.keep_turn <kernel_sandbox.notebook.file.NotebookFile.keep_turn>`),
so its cells are written behind and coalesced as with one process. Whoever finds the
lock taken pokes the keeper first: a byte on the notebook's turn FIFO, ``<stem>.turn``
beside it (:func:`poke`), which the keeper listens on while it keeps the turn; the
keeper then writes what it holds and lets go. The FIFO is a pipe of this host's kernel:
a keeper on another host (replicas sharing a volume across nodes) would not hear it, so
only processes on one host keep turns (workers; replicas on one node's volume, ``serve
--keep-notebook-turns``). Misconfigured (keepers on several hosts), a writer gives up
after :data:`~kernel_sandbox.limits.NOTEBOOK_TURN_WAIT_SECONDS` (NotebookError) instead
of waiting for as long as the keeper's calls come. A keeper that dies lets go with its
process (the ``flock`` and the FIFO's read end close). A ``flock`` is not handed to the
writer that waited longest, so where there is a FIFO every writer first waits in line on
it (a ``flock`` on the FIFO, held until the notebook's lock is its own): a keeper's next
call, taking the turn again just after handing it over, comes after the writer it was
handed to.

How an attaching process finds the notebook: the recorder, once it records a sandbox,
leaves a pointer in the user's private runtime directory (``<sandbox id>.notebook``,
mode 0600, on this machine only, never in the container's labels).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nbformat
import orjson
from nbformat import NotebookNode
from nbformat.v4.rwbase import rejoin_lines, strip_transient

from ..errors import NotebookError
from ..limits import NOTEBOOK_POINTER_CHARS, NOTEBOOK_TURN_WAIT_SECONDS
from ..rundirs import runtime_root
from .storage import read_notebook, validate_parts, write_notebook_atomic

#: Longest pause between two tries of a lock a writer keeping its turn holds (the keeper
#: lets go after a write of a few ms once poked; shorter pauses come first).
TURN_RETRY_SECONDS = 0.004

__all__ = [
    "acquire",
    "append_cells",
    "drain",
    "find_notebook",
    "listen",
    "locked",
    "merge_foreign",
    "point_to",
    "poke",
    "turn_path",
]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the write lock of the notebook at ``path`` for the block (see the module)."""
    fd = acquire(path)
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


def acquire(path: Path) -> int:
    """Take the write lock of the notebook at ``path`` (waiting for it): an exclusive
    ``flock`` on the file it names, or on its directory while it has none.  Returns the
    descriptor that holds it; closing it lets go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _in_line(path) as keepers:
        deadline = time.monotonic() + NOTEBOOK_TURN_WAIT_SECONDS
        while True:
            fd, is_file = _lockable(path)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # taken: a writer that keeps its turn lets go at once
                    poke(path)
                    if keepers:
                        _wait_kept(fd, path, deadline)
                    else:  # writers only hold it for a write
                        fcntl.flock(fd, fcntl.LOCK_EX)
                if _still_current(fd, is_file, path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)


def _wait_kept(fd: int, path: Path, deadline: float) -> None:
    """Wait for the ``flock`` on ``fd`` that a writer keeping its turn holds, until
    ``deadline`` (:data:`~kernel_sandbox.limits.NOTEBOOK_TURN_WAIT_SECONDS`), then raise
    NotebookError: a keeper that cannot hear :func:`poke` (on another host: the FIFO is a
    pipe of one host's kernel) lets go only when its calls stop.  A ``flock`` has no
    timeout, so it is tried again, at most every :data:`TURN_RETRY_SECONDS` (a poked
    keeper lets go after one write), and the keeper poked again every second (one that
    started listening since)."""
    pause, poked = TURN_RETRY_SECONDS / 32, time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise NotebookError(
                f"the notebook {path} stayed locked {NOTEBOOK_TURN_WAIT_SECONDS:.0f} s by a "
                "writer keeping its turn that does not answer its turn FIFO: is the volume "
                "shared across hosts? serve --no-keep-notebook-turns there"
            )
        if now - poked >= 1.0:
            poke(path)
            poked = now
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, TURN_RETRY_SECONDS)


@contextlib.contextmanager
def _in_line(path: Path) -> Iterator[bool]:
    """Wait behind the writers already waiting for the notebook's lock, when a writer may
    keep its turn (:func:`turn_path` is a FIFO): an exclusive ``flock`` on the FIFO, held
    for the block (see the module).  Yields whether a writer may keep its turn."""
    fd = _open_fifo(turn_path(path), os.O_RDONLY)  # None: no writer keeps turns here
    if fd is None:
        yield False
        return
    try:
        with contextlib.suppress(OSError):  # no locks there: wait as without a FIFO
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


def turn_path(path: Path) -> Path:
    """The FIFO on which a writer that keeps the notebook's turn (a server worker between
    its calls, :meth:`NotebookFile.keep_turn <kernel_sandbox.notebook.file.NotebookFile.keep_turn>`)
    listens for another writer that wants it: ``<notebook stem>.turn`` beside it."""
    return path.with_suffix(".turn")


def poke(path: Path) -> None:
    """Tell the writer keeping the notebook's turn, if one listens, that another writer
    waits for it (a byte on :func:`turn_path`'s FIFO; nothing when no FIFO is there or
    nobody reads it)."""
    # None: no FIFO, or nobody listens (ENXIO): whoever holds the lock lets go soon
    fd = _open_fifo(turn_path(path), os.O_WRONLY)
    if fd is None:
        return
    try:
        with contextlib.suppress(OSError):  # full: it has been told already
            os.write(fd, b"!")
    finally:
        os.close(fd)


def listen(path: Path) -> int | None:
    """Open the notebook's :func:`turn_path` FIFO for reading (made if missing, 0600),
    not blocking: a writer that wants the turn then finds someone to tell.  None when
    it cannot be (something else has that name)."""
    turn = turn_path(path)
    with contextlib.suppress(FileExistsError):
        os.mkfifo(turn, 0o600)
    return _open_fifo(turn, os.O_RDONLY)


def _open_fifo(path: Path, flags: int) -> int | None:
    """``path`` opened with ``flags``, not blocking and never through a link, when it is
    a FIFO (before and once open); None otherwise, or when it cannot be opened."""
    try:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            return None
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def drain(fd: int) -> None:
    """Read what waits on a :func:`listen` descriptor (pokes), without blocking."""
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass


def _lockable(path: Path) -> tuple[int, bool]:
    """A descriptor of the notebook (True) or, when there is none, of its directory."""
    flags = os.O_CLOEXEC
    try:  # written to: NFS grants an exclusive flock only on a file open for writing
        return os.open(path, os.O_RDWR | flags), True
    except FileNotFoundError:
        return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | flags), False
    except PermissionError:  # a read-only notebook of a user's: its rewrite replaces it
        return os.open(path, os.O_RDONLY | flags), True


def _still_current(fd: int, is_file: bool, path: Path) -> bool:
    """Whether the lock just taken on ``fd`` is the notebook's: the path still names the
    locked file, or (a directory's lock) still names none."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return not is_file
    if not is_file:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def merge_foreign(nb: NotebookNode, path: Path) -> list[NotebookNode]:
    """Put into ``nb`` the cells on disk at ``path`` that ``nb`` lacks, in their place;
    returns them (validated).

    Call under :func:`locked`.  A cell on disk that ``nb`` holds keeps ``nb``'s version
    (the recorder may have updated it); the cells of ``nb`` not on disk yet come last.
    Only the cells ``nb`` lacks are made into nodes and validated: the file is parsed
    as plain JSON, so merging costs little more than reading its bytes.
    """
    disk = _disk_cells(path)
    if disk is None:
        return []
    ours = {cell.get("id"): cell for cell in nb.cells}
    theirs = [cell for cell in disk if cell.get("id") not in ours]
    if not theirs:
        return []
    adopted = {id(raw): cell for raw, cell in zip(theirs, _as_cells(theirs), strict=True)}
    merged, seen = [], set()
    for cell in disk:
        key = cell.get("id")
        mine = ours[key] if key in ours else adopted[id(cell)]
        if mine is not None:
            merged.append(mine)
        seen.add(key)
    merged.extend(cell for cell in nb.cells if cell.get("id") not in seen)
    nb.cells = merged
    return [cell for cell in adopted.values() if cell is not None]


def _disk_cells(path: Path) -> list[Any] | None:
    """The cells of the notebook at ``path`` as the file holds them; None when there is
    none or it is unreadable (our own next write replaces it whole)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if (
        isinstance(data, dict)
        and data.get("nbformat") == 4
        and isinstance(data.get("nbformat_minor"), int)
        and data["nbformat_minor"] >= 5  # cells have ids
        and isinstance(data.get("cells"), list)
        and all(isinstance(cell, dict) for cell in data["cells"])
    ):
        return list(data["cells"])
    try:  # another version: nbformat upgrades it (and validates it whole)
        return list(read_notebook(path).cells)
    except (OSError, ValueError):
        return None


def _as_cells(raw: list[Any]) -> list[NotebookNode | None]:
    """Cells as a file holds them, made into nodes as nbformat's reader makes them and
    validated; None for one that is not a valid cell (written by hand, say: left out)."""
    cells: list[NotebookNode | None] = []
    for item in raw:
        try:
            one = nbformat.from_dict({"metadata": {}, "cells": [item]})
            strip_transient(rejoin_lines(one))
            cells.append(one.cells[0])
        except (AttributeError, TypeError, ValueError):
            cells.append(None)
    if not _valid([cell for cell in cells if cell is not None]):
        cells = [cell if cell is not None and _valid([cell]) else None for cell in cells]
    return cells


def _valid(cells: list[NotebookNode]) -> bool:
    try:
        validate_parts({}, cells)
    except NotebookError:
        return False
    return True


def append_cells(path: Path, cells: Sequence[NotebookNode]) -> None:
    """Append ``cells`` to the notebook at ``path`` without losing anyone's cells."""
    with locked(path):
        nb = read_notebook(path)
        nb.cells.extend(cells)
        write_notebook_atomic(nb, path)


def _pointer(sandbox_id: str) -> Path:
    if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
        raise ValueError(f"not a sandbox id: {sandbox_id!r}")
    return runtime_root() / f"{sandbox_id}.notebook"


def point_to(sandbox_id: str, notebook: Path) -> None:
    """Leave the pointer from ``sandbox_id`` to its session notebook (see the module)."""
    target = _pointer(sandbox_id)
    tmp = target.with_name(f".{target.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(str(notebook.resolve()))
    os.replace(tmp, target)


def find_notebook(sandbox_id: str) -> Path | None:
    """The session notebook a recorder on this machine keeps for ``sandbox_id``, if any."""
    try:
        fd = os.open(_pointer(sandbox_id), os.O_RDONLY | os.O_NOFOLLOW)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd) as f:
        path = Path(f.read(NOTEBOOK_POINTER_CHARS).strip())
    return path if path.is_absolute() and path.is_file() else None
