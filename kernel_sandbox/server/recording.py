"""Every server sandbox recorded, without stalling the server's event loop.

A :class:`~kernel_sandbox.notebook.NotebookRecorder` that writes after every step
validates and atomically rewrites the whole notebook (about 0.7 ms per recorded cell,
growing with the session), which on the request path would add milliseconds to every
call and stall every other tenant.  The server's recorders write behind instead
(``record_flush_delay``, see :mod:`kernel_sandbox.notebook.writer`): recording a step
only builds its cell in memory, on the loop, in order; the validated atomic rewrite
happens in the writer thread within the delay, coalescing steps, and at once when the
sandbox is stopped or deleted.  With a delay of 0 the old behaviour is kept: each step
is written in a worker thread and awaited (on disk when the client gets its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections import deque
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..events import Event
from ..notebook.recorder import NotebookRecorder
from ..protocols import SandboxLike

__all__ = ["OffLoopRecorder", "private_dirs", "record_pending", "record_sandbox"]

log = logging.getLogger(__name__)


class OffLoopRecorder:
    """A sandbox listener that records each event, writing off the loop.

    With write-behind, even building the event's cell waits until the current
    callback is done (``call_soon``, in order): the call's answer goes out first, and
    the cell is in memory before the loop reads the next request.  A recorded call
    that must have its cells in memory before it lets go of the call lock builds them
    at once (:meth:`record_pending`).
    """

    def __init__(self, recorder: NotebookRecorder) -> None:
        self.recorder = recorder
        self._order = asyncio.Lock()
        self._pending: deque[Event] = deque()  # given, cells not built yet (one callback)

    def __call__(self, event: Event) -> Awaitable[None] | None:
        if self.recorder.flush_delay is not None:
            if not self._pending:
                asyncio.get_running_loop().call_soon(self.record_pending)
            self._pending.append(event)
            return None
        return self._record_now(event)

    def record_pending(self) -> None:
        """Build the cells of the events given so far, now, in order (the callback
        scheduled for them then finds nothing left)."""
        while self._pending:
            event = self._pending.popleft()
            try:
                self.recorder(event)  # a cell in memory; the writer thread writes it
            except Exception:  # as emit() treats a failing listener
                log.warning("recording %r failed", event, exc_info=True)

    async def _record_now(self, event: Event) -> None:
        async with self._order:
            await asyncio.to_thread(self.recorder, event)


def record_pending(sandbox: SandboxLike) -> None:
    """Put every event ``sandbox`` gave its recorders so far into their notebooks now
    (:meth:`OffLoopRecorder.record_pending`): a recorded call's cells, all in memory
    before it takes the notebook's turn, with nothing awaited in between."""
    for listener in sandbox.listeners:
        if isinstance(listener, OffLoopRecorder):
            listener.record_pending()


def private_dirs(*dirs: Path) -> None:
    """Make ``dirs`` (outermost first) directories only this user can open (0700).

    A notebook holds what a tenant computed, so no other local user may read it, nor
    open it or its directory (every write takes a ``flock`` on the notebook, or on its
    directory while there is none: another user holding it would stall the tenant's
    calls and downloads).  A directory that is
    a symbolic link or belongs to another user is refused with a ConfigError.
    """
    for directory in dirs:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise ConfigError(
                f"{directory} is not a directory of this server's user; give --record-dir "
                "a directory the server owns"
            )
        if info.st_mode & 0o077:
            os.chmod(directory, 0o700)


def record_sandbox(
    sandbox: SandboxLike,
    path: Path,
    title: str,
    metadata: dict[str, Any],
    flush_delay: float | None = None,
) -> NotebookRecorder:
    """Start recording ``sandbox`` into ``path``; returns the recorder.

    ``path`` is ``<record dir>/<key id>/<sandbox id>.ipynb``: both directories are
    made private (:func:`private_dirs`), so the notebook is written 0600.
    """
    private_dirs(path.parent.parent, path.parent)
    with contextlib.suppress(FileNotFoundError):  # an adopted sandbox's older notebook
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.chmod(path, 0o600)
    recorder = NotebookRecorder(path, title=title, metadata=metadata, flush_delay=flush_delay)
    recorder.describe_sandbox(sandbox)
    sandbox.listeners.append(OffLoopRecorder(recorder))
    return recorder
