"""A session notebook written by more than one process: its recorder and people attached.

The sandbox's :class:`~kernel_sandbox.notebook.NotebookRecorder` rewrites its notebook
atomically after every step, from the cells it holds in memory.  A person attached to
the same kernel (``kernel-sandbox attach``) records their cells into the same file.
Two writers stay safe by one rule: every write happens under an exclusive ``flock`` on
the notebook's directory and starts from what is on disk, so no writer ever drops a cell it
did not make.  The person's console appends its cells to the file as it is (a
read-append-replace under the lock); the recorder, before each rewrite, merges in the
cells on disk it does not hold (by cell id, in their place).  Each write is still an
atomic replace, so a reader (or a crash) never sees half a notebook.

How an attaching process finds the notebook: the recorder, once it records a sandbox,
leaves a pointer in the user's private runtime directory (``<sandbox id>.notebook``,
mode 0600, on this machine only, never in the container's labels).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from nbformat import NotebookNode

from ..limits import NOTEBOOK_POINTER_CHARS
from ..rundirs import runtime_root
from .storage import read_notebook, write_notebook_atomic

__all__ = ["append_cells", "find_notebook", "locked", "merge_foreign", "point_to"]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the notebook's write lock for the block: a ``flock`` on its directory (no
    lock file left beside it; notebooks in one directory take turns, each write is short)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def merge_foreign(nb: NotebookNode, path: Path) -> None:
    """Put into ``nb`` the cells on disk at ``path`` that ``nb`` lacks, in their place.

    Call under :func:`locked`.  A cell on disk that ``nb`` holds keeps ``nb``'s version
    (the recorder may have updated it); the cells of ``nb`` not on disk yet come last.
    """
    if not path.is_file():
        return
    try:
        disk = read_notebook(path)
    except (OSError, ValueError):  # unreadable: our own next write replaces it whole
        return
    ours = {cell.get("id"): cell for cell in nb.cells}
    if all(cell.get("id") in ours for cell in disk.cells):
        return
    merged, seen = [], set()
    for cell in disk.cells:
        key = cell.get("id")
        merged.append(ours.get(key, cell))
        seen.add(key)
    merged.extend(cell for cell in nb.cells if cell.get("id") not in seen)
    nb.cells = merged


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
