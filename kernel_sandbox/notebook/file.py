"""The session's ``.ipynb`` on disk, kept equal to the notebook a recorder holds in memory.

:class:`NotebookFile` is the writing half of :class:`~kernel_sandbox.notebook.NotebookRecorder`
(which turns events into cells and tells the file when they changed). Three jobs:

- **when** — at once after every change, or, with a ``flush_delay`` (the server's
  choice), behind: a change only marks the file dirty and :mod:`.writer`'s thread writes
  it within that delay, coalescing changes; at once on :meth:`~NotebookFile.flush`.
- **with whom** — a person attached to the sandbox may append cells to the same file
  (:mod:`.shared`): a write reads the file back when someone else wrote it since, keeps
  their cells in their place and adopts them into the live notebook.
- **how much to check** — the cost of a write grows with the session, and in a server it
  runs beside the requests, so only the metadata and the cells not validated by an
  earlier write are validated (nbformat's schema); each write is still one atomic
  replace, so a reader or a crash only ever sees a complete notebook.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import nbformat
import orjson
from nbformat import NotebookNode

from . import shared
from .storage import replace_notebook, validate_parts
from .writer import WRITER

__all__ = ["NotebookFile"]


class NotebookFile:
    """Writes ``nb`` (changed only under ``lock``) to ``path``: at once, or within
    ``flush_delay`` seconds."""

    def __init__(
        self,
        path: Path,
        nb: NotebookNode,
        lock: threading.RLock,
        flush_delay: float | None = None,
    ) -> None:
        self.path = path
        self._nb = nb
        self._lock = lock
        self._write_lock = threading.Lock()  # one write of this file at a time
        #: None: write after every change; seconds: write behind, within this delay.
        self.flush_delay = flush_delay if flush_delay and flush_delay > 0 else None
        self._dirty = False
        #: Leading cells validated by an earlier write and unchanged since: a write
        #: validates the metadata and the cells after them only.
        self._valid_cells = 0
        #: The notebook's lock while a turn is taken (take_turn), else None.
        self._turn: int | None = None
        #: (inode, size, mtime) of the file as this object last wrote it: unchanged,
        #: nobody else appended cells, so the write need not read it back first.
        self._written: tuple[int, int, int] | None = None

    def changed(self) -> None:
        """The notebook changed (call under the lock): write it now, or schedule it."""
        if self.flush_delay is None:
            self._valid_cells = self._write(self._nb, self._valid_cells)
            return
        self._dirty = True
        WRITER.schedule(self, self.flush_delay)

    def cells_changed_from(self, index: int) -> None:
        """Cells from ``index`` on were edited in place: validate them again (under the lock)."""
        self._valid_cells = min(self._valid_cells, index)

    def flush(self) -> None:
        """Write what is not on disk yet, now (validated, atomic); raises NotebookError."""
        with self._write_lock:
            self._flush(held=False)

    def take_turn(self) -> None:
        """Take the notebook's write lock now (waiting for it) and keep it until
        :meth:`flush_turn`: whatever this recorder holds now is written before any
        process's next write of the notebook, even if the write itself comes later.

        Only for a file written behind (a ``flush_delay``).  A server's recorded call
        takes its turn before it lets go of the sandbox's call lock, and writes its
        cells after its answer: the next call, in any process, runs meanwhile, and its
        cells are written after these.
        """
        if self.flush_delay is None:
            raise ValueError("take_turn is for a notebook written behind (a flush_delay)")
        self._write_lock.acquire()
        try:
            self._turn = shared.acquire(self.path)
        except BaseException:
            self._write_lock.release()
            raise

    def flush_turn(self) -> None:
        """Write what is not on disk yet under the lock :meth:`take_turn` took, and let
        it go (also when the write fails: raises NotebookError then)."""
        turn, self._turn = self._turn, None
        try:
            self._flush(held=turn is not None)
        finally:
            if turn is not None:
                os.close(turn)
            self._write_lock.release()

    def _flush(self, held: bool) -> None:
        """:meth:`flush` under ``_write_lock``; ``held``: the notebook's lock too."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            # a plain copy, taken at C speed (a deepcopy of NotebookNodes is not)
            snapshot = nbformat.from_dict({**self._nb, "cells": []})
            snapshot.cells = orjson.loads(orjson.dumps(self._nb.cells))
            valid = self._valid_cells
        WRITER.cancel(self)
        ids = [cell.get("id") for cell in snapshot.cells]
        try:
            checked = self._write(snapshot, valid, held)
        except BaseException:
            with self._lock:
                self._dirty = True
            raise
        with self._lock:
            if [cell.get("id") for cell in snapshot.cells] != ids:
                self._take_foreign(snapshot.cells)
            if self._valid_cells == valid:  # no cell before the new ones changed since
                self._valid_cells = checked

    def __repr__(self) -> str:
        return f"<NotebookFile {str(self.path)!r}>"

    def _take_foreign(self, written: list[Any]) -> None:
        """Make the cells someone else wrote (merged into ``written``, the copy just
        written) ours too, in their place, so the next write need not read them back."""
        live = {cell.get("id"): cell for cell in self._nb.cells}
        cells = [live.get(cell.get("id")) or nbformat.from_dict(cell) for cell in written]
        seen = {cell.get("id") for cell in written}
        cells.extend(cell for cell in self._nb.cells if cell.get("id") not in seen)
        self._nb.cells = cells

    def _write(self, nb: NotebookNode, valid: int, held: bool = False) -> int:
        """Write ``nb`` (its first ``valid`` cells known valid); the cells now known valid.

        The file is read back only when someone else wrote it since, and only the
        metadata and the cells not validated before are validated: neither ours from
        earlier writes nor theirs, which the merge validated.  ``held``: the caller
        holds the notebook's lock already.
        """
        with contextlib.nullcontext() if held else shared.locked(self.path):
            checked = {id(cell) for cell in nb.cells[:valid]}
            # Another process may have written cells since: keep them (shared.py)
            if self._written is None or self._written != _stamp(self.path):
                checked.update(id(cell) for cell in shared.merge_foreign(nb, self.path))
            fresh = [cell for cell in nb.cells if id(cell) not in checked]
            validate_parts(nb.metadata, fresh, nb.get("nbformat_minor", 5))
            self._written = _stamp_of(replace_notebook(nb, self.path))
        return len(nb.cells)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of a file from another (a rename makes a new inode)."""
    try:
        return _stamp_of(path.stat())
    except OSError:
        return None


def _stamp_of(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_ino, info.st_size, info.st_mtime_ns)
