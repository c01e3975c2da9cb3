"""The session's ``.ipynb`` on disk, kept equal to the notebook a recorder holds in memory.

:class:`NotebookFile` is the writing half of :class:`~kernel_sandbox.notebook.NotebookRecorder`
(which turns events into cells and tells the file when they changed). Three jobs:

- **when** — at once after every change, or, with a ``flush_delay`` (the server's
  choice), behind: a change only marks the file dirty and :mod:`.writer`'s thread writes
  it within that delay, coalescing changes; at once on :meth:`~NotebookFile.flush`.
- **with whom** — a person attached to the sandbox may append cells to the same file
  (:mod:`.shared`): a write reads the file back when someone else wrote it since, keeps
  their cells in their place and adopts them into the live notebook.  A server worker
  takes the notebook's lock before its call lets the next call run, and may keep it
  while its calls come (:meth:`~NotebookFile.keep_turn`), handing it over when poked.
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
from .storage import replace_notebook, replace_notebook_locked, validate_parts
from .writer import HANDOVER, WRITER

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
        #: The notebook's lock while a turn is taken (take_turn) or kept (keep_turn).
        self._turn: int | None = None
        self._once = False  # taken by take_turn, let go by flush_turn
        #: The turn FIFO's read end while the turn is kept (keep_turn), else None.
        self._kept: int | None = None
        #: Poked: the kept turn is being handed over (hand_over); calls take it again.
        self._handing = False
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
        """Write what is not on disk yet, now (validated, atomic); raises NotebookError.
        A turn kept (:meth:`keep_turn`) is let go once nothing is left to write."""
        with self._write_lock:
            try:
                self._flush()
            finally:
                self._let_go(force=False)

    def write_behind(self) -> None:
        """The write behind's visit (:data:`~.writer.WRITER`): write what is not on disk
        yet.  A turn kept stays kept while there was something to write (one more visit
        is due within the delay), and is let go at the first visit with nothing to
        write: a worker whose calls keep coming keeps the turn until another wants it."""
        with self._write_lock:
            try:
                wrote = self._flush()
            except BaseException:
                self._let_go(force=True)
                raise
            if not wrote or self.flush_delay is None:
                self._let_go(force=False)
            elif self._kept is not None:
                WRITER.schedule(self, self.flush_delay)

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
            if self._turn is None:  # else kept already (keep_turn): ours until let go
                self._turn = shared.acquire(self.path)
                self._once = True
        except BaseException:
            self._write_lock.release()
            raise

    def flush_turn(self) -> None:
        """Write what is not on disk yet under the lock :meth:`take_turn` took, and let
        it go (also when the write fails: raises NotebookError then)."""
        try:
            self._flush()
        finally:
            if self._once and self._turn is not None:
                os.close(self._turn)
                self._turn = None
            self._once = False
            self._let_go(force=False)
            self._write_lock.release()

    @property
    def keeps_turn(self) -> bool:
        """Whether this file keeps the notebook's turn now (:meth:`keep_turn`) and is not
        handing it over: the cells held now are then written before it is let go.

        Asked under the lock, as the hand-over marks itself before it copies the cells
        to write: a call that finds the turn kept after its cells are in memory has
        them written under it; one that does not takes the turn again."""
        with self._lock:
            return self._kept is not None and not self._handing

    def keep_turn(self) -> None:
        """Take the notebook's write lock (waiting for it) unless kept already, and keep
        it: the cells held now and those added while it is kept are written before any
        other writer's next ones, and the writes coalesce as with one writer.

        A server worker's recorded call keeps the turn before it lets go of the sandbox's
        call lock; its later calls find it kept and write nothing on the request path.
        The turn is let go by the write behind (within ``flush_delay``) once nothing
        is left to write, and at once when another writer wants it: the waiter pokes
        the notebook's turn FIFO (:func:`.shared.poke`), and this process's
        :data:`~.writer.HANDOVER` thread writes the cells held then and lets go
        (:meth:`hand_over`); the calls after take the turn again, waiting like any
        writer.  A process that dies keeping it lets go with it (a ``flock``).
        Without a FIFO (something else has its name) the turn is taken and let go at once,
        the cells written.
        """
        if self.flush_delay is None:
            raise ValueError("keep_turn is for a notebook written behind (a flush_delay)")
        if self.keeps_turn:
            return
        with self._write_lock:  # the order of every writer here: _write_lock, then the flock
            if self._kept is not None:  # kept again meanwhile (a hand-over ends under this lock)
                return
            reader = shared.listen(self.path)  # open first: a poke always finds a reader
            try:
                turn = shared.acquire(self.path)
            except BaseException:
                if reader is not None:
                    os.close(reader)
                raise
            if reader is None:
                self._turn = turn
                try:
                    self._flush()
                finally:
                    self._turn = None
                    os.close(turn)
                return
            with self._lock:
                self._turn, self._kept = turn, reader
            HANDOVER.watch(reader, self)
        WRITER.schedule(self, self.flush_delay)  # writes; the first visit with nothing lets go

    def hand_over(self, fd: int) -> None:
        """Another writer wants the turn kept on ``fd`` (poked): write what is held now
        and let go, whatever this process's calls record meanwhile (they take the turn
        again, after the waiter: :attr:`keeps_turn` is False from the start).  The
        waiter waits for the write under way, if any, and this one
        (:data:`~.writer.HANDOVER`'s thread)."""
        with self._write_lock:
            with self._lock:
                if self._kept != fd:  # let go already
                    return
                self._handing = True
            shared.drain(fd)
            try:
                self._flush()
            finally:  # also when the write fails: the waiter goes on, our cells come later
                self._let_go(force=True)

    def _let_go(self, force: bool) -> None:
        """Let go of a kept turn when nothing is left to write (or ``force``); under
        ``_write_lock``."""
        with self._lock:
            if self._kept is None or (self._dirty and not force):
                return
            turn, reader = self._turn, self._kept
            self._turn = self._kept = None
            self._handing = False
        HANDOVER.unwatch(reader)
        if turn is not None:
            os.close(turn)  # the lock first, then the FIFO: a waiter always finds a reader
        os.close(reader)

    def _flush(self) -> bool:
        """:meth:`flush` under ``_write_lock`` (and under the notebook's lock when a turn
        is taken or kept); whether there was something to write."""
        with self._lock:
            WRITER.cancel(self)  # before the snapshot: what comes after schedules again
            if not self._dirty:
                return False
            self._dirty = False
            # a plain copy, taken at C speed (a deepcopy of NotebookNodes is not)
            snapshot = nbformat.from_dict({**self._nb, "cells": []})
            snapshot.cells = orjson.loads(orjson.dumps(self._nb.cells))
            valid = self._valid_cells
        ids = [cell.get("id") for cell in snapshot.cells]
        try:
            checked = self._write(snapshot, valid, held=self._turn is not None)
        except BaseException:
            with self._lock:
                self._dirty = True
            raise
        with self._lock:
            if [cell.get("id") for cell in snapshot.cells] != ids:
                self._take_foreign(snapshot.cells)
            if self._valid_cells == valid:  # no cell before the new ones changed since
                self._valid_cells = checked
        return True

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
            if held and self._kept is not None:  # kept: the new file is locked as it comes
                info, turn = replace_notebook_locked(nb, self.path)
                if self._turn is not None:
                    os.close(self._turn)  # the replaced file's lock: its waiters look again
                self._turn = turn
            else:
                info = replace_notebook(nb, self.path)
            self._written = _stamp_of(info)
        return len(nb.cells)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of a file from another (a rename makes a new inode)."""
    try:
        return _stamp_of(path.stat())
    except OSError:
        return None


def _stamp_of(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_ino, info.st_size, info.st_mtime_ns)
