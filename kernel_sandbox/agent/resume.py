"""Resume an agent session from its notebook: a fresh sandbox, the same state, the same
conversation, and a new notebook that links its parent.

A session notebook holds everything needed: its code, shell and ``%%writefile`` cells
rebuild the sandbox's state when replayed in order (variables, and the files tools
wrote), and its metadata keeps the conversation (``kernel_sandbox.messages``, saved by
the agent loop at the end of every task).  Resuming:

1. starts a new session (fresh sandbox, new notebook) without recording the replay as
   new steps;
2. replays the parent's cells in the sandbox with the notebook replayer and compares
   each output with the recorded one; the first cell that diverges stops the resume
   with :class:`ResumeDivergedError` naming the cell, unless ``allow_divergence``
   (then every divergence is listed in the new notebook);
3. copies the parent's cells into the new notebook (as recorded), adds a note saying
   what was resumed, restores the conversation, and hands back the session, whose
   next :meth:`~.loop.AgentSession.send` goes on where the parent stopped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nbformat
from nbformat import NotebookNode

from ..errors import NotebookError, ResumeDivergedError
from ..notebook.cells import META_KEY
from ..notebook.compare import Tolerance
from ..notebook.replay import areplay
from ..notebook.report import CellReplay, ReplayReport
from ..notebook.storage import read_notebook
from .loop import AgentSession

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["ResumeDivergedError", "resume_session"]


class _Diverged(Exception):
    def __init__(self, cell: CellReplay) -> None:
        self.cell = cell


def conversation_of(nb: NotebookNode, source: Path) -> list[dict[str, Any]]:
    """The conversation a session notebook recorded; NotebookError if it has none."""
    session = nb.metadata.get(META_KEY) or {}
    messages = session.get("messages")
    if not isinstance(messages, list) or not messages:
        raise NotebookError(
            f"{source} holds no conversation to resume (kernel_sandbox.messages): only "
            "agent sessions recorded by this version can be resumed; replay it instead"
        )
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise NotebookError(f"{source}: kernel_sandbox.messages is not a list of messages")
    return [dict(m) for m in messages]


async def resume_session(
    agent: Agent,
    notebook: str | os.PathLike[str],
    *,
    allow_divergence: bool = False,
    notebook_path: str | os.PathLike[str] | None = None,
    tolerance: Tolerance | None = None,
) -> AgentSession:
    """A started :class:`~.loop.AgentSession` with the state and conversation of
    ``notebook``; close it (or use ``async with``) when done."""
    source = Path(notebook)
    parent = read_notebook(source)
    messages = conversation_of(parent, source)
    session = AgentSession(agent, notebook_path=notebook_path)
    await session.start()
    try:
        report = await _rebuild(session, parent, allow_divergence, tolerance)
        _adopt(session, parent, source, messages, report)
    except BaseException:
        recorder = session.recorder
        if recorder is not None:
            session.recording.step(type(recorder).finish, "failed", "resume did not complete")
        await session.close()
        raise
    return session


async def _rebuild(
    session: AgentSession,
    parent: NotebookNode,
    allow_divergence: bool,
    tolerance: Tolerance | None,
) -> ReplayReport:
    """Replay the parent's cells in the session's sandbox, unrecorded."""
    sandbox = session.sandbox
    assert sandbox is not None  # the session was started
    listener = session.recorder  # listens to the sandbox (None when recording is off)
    if listener is not None:
        sandbox.listeners.remove(listener)  # the replay is not a new step of the session

    def on_cell(cell: CellReplay) -> None:
        if cell.failed and not allow_divergence:
            raise _Diverged(cell)

    try:
        return await areplay(
            nbformat.from_dict(parent), sandbox=sandbox, tolerance=tolerance, on_cell=on_cell
        )
    except _Diverged as stop:
        cell = stop.cell
        raise ResumeDivergedError(
            f"replaying the parent notebook diverged at {cell.label}: {cell.headline}; "
            "the sandbox's state may not be what the conversation assumes. Resume anyway "
            "with allow_divergence=True (CLI: --allow-divergence), or fix the notebook",
            cell,
        ) from None
    finally:
        if listener is not None:
            sandbox.listeners.append(listener)


def _adopt(
    session: AgentSession,
    parent: NotebookNode,
    source: Path,
    messages: list[dict[str, Any]],
    report: ReplayReport,
) -> None:
    """Give the session the parent's conversation; start its notebook with the parent's."""
    session.messages = messages
    recorder = session.recorder
    if recorder is None:
        return
    meta = parent.metadata.get(META_KEY) or {}
    diverged = [c.label for c in report.cells if c.failed]
    recorder.add_cells(parent.cells)
    note = (
        f"**Resumed** from `{source.name}` (session {meta.get('session_id', '?')}): "
        f"{len(report.cells)} cells replayed in a fresh sandbox, {report.summary}."
    )
    if diverged:
        note += " Diverged (resumed anyway): " + ", ".join(diverged) + "."
    recorder.add_note(note, {"resume": True})
    recorder.set_metadata(
        parent={
            "path": str(source),
            "session_id": meta.get("session_id"),
            "status": meta.get("status"),
        },
        resumed={"cells_replayed": len(report.cells), "diverged": diverged},
        messages=messages,
    )
