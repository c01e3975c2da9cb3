"""Write-behind for session notebooks: cheap steps, bounded staleness, still crash-safe.

Validating and atomically rewriting a whole notebook costs about 0.7 ms per recorded
cell, so doing it on every step makes each step slower as the session grows (and, in
the server, stalls every other tenant's request).  A recorder made with a
``flush_delay`` instead only marks itself dirty; one shared daemon thread, the
:class:`WriteBehind` writer, writes each dirty recorder at most ``flush_delay`` seconds
later, coalescing every step made in between into one write.  Each write is still the
same validated, atomic replace (a reader or a crash only ever sees a complete
notebook), the recorder is written at once on :meth:`~NotebookRecorder.flush`,
``finish`` and ``close``, and every pending write is done at interpreter exit.  What a
``kill -9`` can lose is bounded: the steps of the last ``flush_delay`` seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import selectors
import threading
import time
from typing import Protocol

__all__ = ["HANDOVER", "WRITER", "Flushable", "Handover", "Keeper", "WriteBehind"]

log = logging.getLogger(__name__)


class Flushable(Protocol):
    """What the writer needs of a notebook file (:class:`~.file.NotebookFile`)."""

    def write_behind(self) -> None: ...


class WriteBehind:
    """One daemon thread that flushes dirty recorders when their delay is over."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[Flushable, float] = {}  # recorder -> monotonic time to write by
        self._thread: threading.Thread | None = None
        self._registered = False

    def schedule(self, recorder: Flushable, delay: float) -> None:
        """Write ``recorder`` within ``delay`` seconds (an earlier schedule stands)."""
        with self._cond:
            if recorder in self._due:
                return
            due = time.monotonic() + delay
            first = min(self._due.values(), default=None)
            self._due[recorder] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="kernel-sandbox-notebook-writer", daemon=True
                )
                self._thread.start()
            if not self._registered:
                atexit.register(self.flush_all)
                self._registered = True
            if first is None or due < first:  # else the thread wakes up soon enough
                self._cond.notify()

    def cancel(self, recorder: Flushable) -> None:
        """Forget a pending write (the recorder just wrote itself)."""
        with self._cond:
            self._due.pop(recorder, None)

    def pending(self) -> int:
        """How many recorders wait for their write."""
        with self._cond:
            return len(self._due)

    def flush_all(self) -> None:
        """Write every pending recorder now (at exit, and for tests)."""
        with self._cond:
            waiting = list(self._due)
            self._due.clear()
        for recorder in waiting:
            self._write(recorder)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due:
                    self._cond.wait()
                recorder, when = min(self._due.items(), key=lambda item: item[1])
                wait = when - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                del self._due[recorder]
            self._write(recorder)

    @staticmethod
    def _write(recorder: Flushable) -> None:
        try:
            recorder.write_behind()
        except Exception:  # the recorder keeps the error and raises it on its next flush
            log.warning("writing the session notebook of %r failed", recorder, exc_info=True)


class Keeper(Protocol):
    """What :class:`Handover` needs of a notebook file that keeps its turn."""

    def hand_over(self, fd: int) -> None: ...


class Handover:
    """One daemon thread that listens on the turn FIFOs (:func:`.shared.listen`) of the
    notebooks whose turn this process keeps, and hands a turn over (its file written and
    the lock let go, :meth:`~.file.NotebookFile.hand_over`) as soon as another writer
    pokes it.  Blocked in ``epoll`` otherwise: nothing is polled."""

    def __init__(self) -> None:
        self._selector: selectors.BaseSelector | None = None
        self._start = threading.Lock()

    def watch(self, fd: int, keeper: Keeper) -> None:
        """Hand ``keeper``'s turn over when ``fd`` (its turn FIFO, read end) is poked."""
        with self._start:
            if self._selector is None:
                self._selector = selectors.DefaultSelector()
                threading.Thread(
                    target=self._run,
                    args=(self._selector,),
                    name="kernel-sandbox-notebook-handover",
                    daemon=True,
                ).start()
        self._selector.register(fd, selectors.EVENT_READ, keeper)

    def unwatch(self, fd: int) -> None:
        """Stop listening on ``fd`` (before it is closed)."""
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)

    @staticmethod
    def _run(selector: selectors.BaseSelector) -> None:
        while True:
            for key, _ in selector.select():
                try:
                    key.data.hand_over(key.fd)
                except Exception:  # the file keeps the error for its next flush
                    log.warning("handing over the turn of %r failed", key.data, exc_info=True)


#: The process's writer; every write-behind recorder uses it.
WRITER = WriteBehind()
#: The process's listener for turns kept (server workers, :meth:`~.file.NotebookFile.keep_turn`).
HANDOVER = Handover()
