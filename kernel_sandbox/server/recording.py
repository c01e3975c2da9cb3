"""Every server sandbox recorded, without stalling the server's event loop.

:class:`~kernel_sandbox.notebook.NotebookRecorder` validates and atomically rewrites the
whole notebook after each step (that is what makes it crash-safe), which costs
milliseconds per step and grows with the notebook.  In a server that work would block
every other tenant's requests, so each step is recorded in a worker thread, awaited
before the call returns (the step is on disk when the client gets its answer), one
step at a time per sandbox, in order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..events import Event
from ..notebook.recorder import NotebookRecorder

__all__ = ["OffLoopRecorder", "record_sandbox"]


class OffLoopRecorder:
    """A sandbox listener that hands each event to a recorder in a worker thread."""

    def __init__(self, recorder: NotebookRecorder) -> None:
        self.recorder = recorder
        self._order = asyncio.Lock()

    async def __call__(self, event: Event) -> None:
        async with self._order:
            await asyncio.to_thread(self.recorder, event)


def record_sandbox(
    sandbox: Any, path: Path, title: str, metadata: dict[str, Any]
) -> NotebookRecorder:
    """Start recording ``sandbox`` into ``path``; returns the recorder."""
    recorder = NotebookRecorder(path, title=title, metadata=metadata)
    recorder.describe_sandbox(sandbox)
    sandbox.listeners.append(OffLoopRecorder(recorder))
    return recorder
