"""NotebookRecorder: a session, step by step, as a ``.ipynb`` a person can open and re-run.

The recorder only listens: attach it to a sandbox (``sandbox.listeners.append(rec)`` or
:meth:`NotebookRecorder.attach`) and every ``run_python`` / ``run_shell`` / file
operation / restart becomes a cell, with the metadata of the call that caused it (the
sandbox tags its events, see :func:`~kernel_sandbox.events.call_context`).  An agent
loop also adds messages, and merges each tool call's verdict into the cells that carry
its id (:meth:`NotebookRecorder.finish_call`).  This module turns events into cells; the
file on disk is :mod:`.file`'s :class:`~kernel_sandbox.notebook.file.NotebookFile`,
told after every step: validated and atomically rewritten then, so a crash or
``kill -9`` leaves a valid notebook of everything up to the last step, or with
``flush_delay`` (the server's choice) written behind within that delay, coalescing
steps, and at once on ``flush``/``finish``/``close`` and at exit: a step then costs
microseconds instead of a validation and an fsync, and a crash loses at most that
delay's steps.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell, new_notebook

from ..contexts import DEFAULT_CONTEXT
from ..events import (
    ContextChanged,
    EgressRefused,
    Event,
    FileOperated,
    KernelRestarted,
    PythonExecuted,
    ShellExecuted,
)
from ..protocols import SandboxLike
from ..results import CommandResult, Execution
from ..sync import Sandbox, as_async
from . import shared
from .budget import OutputBudget
from .cells import (
    META_KEY,
    file_cell,
    iso_time,
    jsonable,
    message_cell,
    note_cell,
    python_cell,
    shell_cell,
)
from .file import NotebookFile
from .languages import (
    PYTHON_KERNELSPEC,
    PYTHON_LANGUAGE_INFO,
    language_metadata,
    notebook_kernel,
    notebook_language,
)
from .tags import seeds_randomness

__all__ = ["DEFAULT_SESSION_DIR", "FORMAT_VERSION", "NotebookRecorder", "new_session_path"]

#: Where agent sessions are recorded unless told otherwise (relative to the cwd).
DEFAULT_SESSION_DIR = Path("notebooks") / "sessions"
#: Version of the ``kernel_sandbox`` metadata layout written into notebooks.
FORMAT_VERSION = 1

# Settings worth knowing when reading or replaying a session; never env vars or
# volumes (they may hold secrets or host paths).
_RECORDED_SETTINGS = (
    "image",
    "kernel",
    "working_dir",
    "user",
    "network_enabled",
    "network",
    "memory_limit",
    "timeout",
)


def new_session_path(
    directory: str | os.PathLike[str] = DEFAULT_SESSION_DIR, prefix: str = "session"
) -> Path:
    """A fresh, sortable file name for a session: ``DIR/session-20250101-120000-ab12cd.ipynb``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(directory) / f"{prefix}-{stamp}-{secrets.token_hex(3)}.ipynb"


class NotebookRecorder:
    """Records one session into one notebook file, rewritten after every step.

    It is a listener: calling it with a :mod:`~kernel_sandbox.events` event records the
    step.  The explicit ``add_*`` methods do the same for callers that hold results
    (the agent loop).  Recording the same ``Execution`` / ``CommandResult`` object
    twice (once from the sandbox event, once from the agent loop with its tool-call
    id) gives one cell whose metadata merges both.  Thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        flush_delay: float | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else new_session_path()
        self._lock = threading.RLock()
        #: Bumped on every change; readers (the live page) wait for it to move.
        self.version = 0
        self._watchers: list[Any] = []
        self._steps = 0
        self._seeded = False  # a recorded cell seeded the random generators
        #: Where each context made during the session started (its ContextChanged).
        self._context_cwds: dict[str, str] = {}
        self._working_dir: str | None = None
        #: What the notebook keeps of calls' outputs (per call and in all: budget.py).
        self._budget = OutputBudget()
        now = iso_time()
        session: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "session_id": secrets.token_hex(8),
            "status": "running",
            "started_at": now,
            "updated_at": now,
        }
        session.update(jsonable(dict(metadata or {})))
        self._nb: NotebookNode = new_notebook(
            metadata={
                "kernelspec": dict(PYTHON_KERNELSPEC),
                "language_info": dict(PYTHON_LANGUAGE_INFO),
                META_KEY: session,
            }
        )
        if title:
            self._nb.cells.append(
                new_markdown_cell(f"# {title}", metadata={META_KEY: {"kind": "note"}})
            )
        self._file = NotebookFile(self.path, self._nb, self._lock, flush_delay)
        self._save()
        self.flush()  # the file exists from the start, whatever the delay

    # -- wiring -----------------------------------------------------------------------

    @classmethod
    def attach(
        cls,
        sandbox: SandboxLike | Sandbox,
        path: str | os.PathLike[str] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> NotebookRecorder:
        """Record everything ``sandbox`` (async or blocking) does from now on into ``path``."""
        inner = as_async(sandbox)
        recorder = cls(path, title=title, metadata=metadata)
        recorder.describe_sandbox(inner)
        inner.listeners.append(recorder)
        return recorder

    def detach(self, sandbox: SandboxLike | Sandbox) -> None:
        """Stop recording ``sandbox``; the notebook stays as it is."""
        inner = as_async(sandbox)
        if self in inner.listeners:
            inner.listeners.remove(self)

    def describe_sandbox(self, sandbox: SandboxLike | Sandbox) -> None:
        """Store the sandbox's id, image and main settings in the notebook metadata, its
        own kernel as the notebook's ``kernelspec``/``language_info`` (see
        :mod:`.languages`), and leave the pointer by which a person's console finds
        this notebook."""
        inner = as_async(sandbox)
        config = inner.config
        settings = {name: getattr(config, name, None) for name in _RECORDED_SETTINGS}
        kernelspec, language_info = notebook_kernel(inner)
        self._working_dir = getattr(inner, "working_dir", None)
        with self._lock:
            self._nb.metadata["kernelspec"] = kernelspec
            self._nb.metadata["language_info"] = language_info
        self.set_metadata(
            image=config.image,
            kernel_image=inner.image,
            sandbox_id=inner.id,
            sandbox=settings,
        )
        if isinstance(inner.id, str):  # so `kernel-sandbox attach` records here too
            with contextlib.suppress(OSError, ValueError):
                shared.point_to(inner.id, self.path)

    def __call__(self, event: Event) -> None:
        """Listener entry point: record a sandbox event; other events are ignored."""
        meta = {"sandbox_id": event.sandbox_id, **getattr(event, "metadata", {})}
        if isinstance(event, PythonExecuted):
            self.add_code(
                event.code,
                event.execution,
                meta,
                language=event.language,
                kernel=event.kernel,
                context=event.context_id,
                started_at=event.started_at,
            )
        elif isinstance(event, ContextChanged) and event.change == "created":
            self._context_cwds[event.context.id] = event.context.cwd
        elif isinstance(event, ShellExecuted):
            self.add_shell(
                event.command, event.result, meta, cwd=event.cwd, started_at=event.started_at
            )
        elif isinstance(event, EgressRefused):
            self.add_note(event.sentence(), {**meta, "egress_refused": len(event.refusals)})
        elif isinstance(event, FileOperated):
            self.add_file_operation(
                event.operation,
                event.path,
                content=event.content,
                size=event.size,
                error=event.error,
                detail=event.detail,
                metadata=meta,
                started_at=event.started_at,
            )
        elif isinstance(event, KernelRestarted) and event.requested:
            # a restart after a dead or stuck kernel is told by its execution's note
            what = "sandbox restarted" if event.whole else "kernel restarted"
            self.add_note(f"**{what}:** {event.message}", {**meta, "restart": what})

    def finish_call(self, call_id: str, metadata: Mapping[str, Any]) -> bool:
        """Merge a call's verdict into every cell its sandbox events made.

        Cells know their call by the ``tool_call_id`` in their metadata.  Returns False
        when no cell has it (the call never reached the sandbox), so the caller can
        record why instead.
        """
        with self._lock:
            cells = [
                cell
                for cell in self._nb.cells
                if cell.metadata.get(META_KEY, {}).get("tool_call_id") == call_id
            ]
            for cell in cells:
                cell.metadata[META_KEY].update(jsonable(dict(metadata)))
            if cells:
                first = next(i for i, c in enumerate(self._nb.cells) if c is cells[0])
                self._file.cells_changed_from(first)
                self._save()
            return bool(cells)

    # -- steps ------------------------------------------------------------------------

    def add_user_message(self, text: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Record what the user asked, as a markdown cell."""
        self._append(message_cell("user", text, metadata))

    def add_assistant_message(self, text: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Record what the model said (its answer or its words between tool calls)."""
        self._append(message_cell("assistant", text, metadata))

    def add_message(self, role: str, text: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Record a message of any role (e.g. ``system``)."""
        self._append(message_cell(role, text, metadata))

    def add_note(self, text: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Record a markdown remark (not a message, never replayed)."""
        self._append(note_cell(text, metadata))

    def add_python(
        self,
        code: str,
        execution: Execution,
        metadata: Mapping[str, Any] | None = None,
        *,
        started_at: float | None = None,
    ) -> None:
        """Record one Python execution with its real outputs (see ``cells.python_cell``)."""
        self.add_code(code, execution, metadata, started_at=started_at)

    def add_code(
        self,
        code: str,
        execution: Execution,
        metadata: Mapping[str, Any] | None = None,
        *,
        language: str | None = None,
        kernel: str | None = None,
        context: str | None = None,
        started_at: float | None = None,
    ) -> None:
        """Record one execution in any kernel of the sandbox: its outputs, and where it
        ran (``language``, ``kernel``, ``context``; see :mod:`.languages`), given or not."""
        with self._lock:
            where = None
            if language is not None:
                cwd = self._context_cwds.get(context or DEFAULT_CONTEXT)
                where = language_metadata(
                    language,
                    kernel or language,
                    context or DEFAULT_CONTEXT,
                    notebook_language(self._nb),
                    cwd if cwd != self._working_dir else None,
                )
            cell = python_cell(
                code,
                execution,
                metadata,
                started_at,
                seeded=self._seeded,
                budget=self._budget,
                where=where,
            )
            self._seeded = self._seeded or seeds_randomness(code)
            self._nb.cells.append(cell)
            if execution.status in ("timeout", "kernel_died") and execution.message:
                self._nb.cells.append(
                    note_cell(f"**{execution.status.replace('_', ' ')}:** {execution.message}")
                )
            self._step()

    def add_shell(
        self,
        command: str,
        result: CommandResult,
        metadata: Mapping[str, Any] | None = None,
        *,
        cwd: str | None = None,
        started_at: float | None = None,
    ) -> None:
        """Record one shell command as a re-runnable ``%%sh`` cell."""
        with self._lock:
            cell = shell_cell(command, result, cwd, metadata, started_at, self._budget)
            self._nb.cells.append(cell)
            self._step()

    def add_file_operation(
        self,
        operation: str,
        path: str,
        *,
        content: bytes | str | None = None,
        size: int | None = None,
        error: str = "",
        detail: str = "",
        metadata: Mapping[str, Any] | None = None,
        started_at: float | None = None,
    ) -> None:
        """Record a file operation; pass ``content`` for writes so replay can redo them."""
        self._append(
            file_cell(
                operation,
                path,
                content=content,
                size=size,
                error=error,
                detail=detail,
                metadata=metadata,
                started_at=started_at,
            )
        )

    def add_cells(self, cells: Any) -> None:
        """Append copies of existing cells as they are (a resumed session's parent)."""
        with self._lock:
            for cell in cells:
                self._nb.cells.append(nbformat.from_dict(jsonable(cell)))
            self._step()

    def set_metadata(self, mapping: Mapping[str, Any] | None = None, **fields: Any) -> None:
        """Add or change session metadata (model name, image, budgets...) and save."""
        with self._lock:
            session = self._nb.metadata[META_KEY]
            session.update(jsonable({**dict(mapping or {}), **fields}))
            self._save()

    def finish(self, status: str = "completed", reason: str = "") -> Path:
        """Mark the session as ended (``completed``, ``budget_exhausted``, ``failed``...)."""
        fields = {"status": status, "finished_at": iso_time()}
        if reason:
            fields["reason"] = reason
        self.set_metadata(fields)
        self.flush()
        return self.path

    @property
    def flush_delay(self) -> float | None:
        """None: the file is written after every step; seconds: behind, within this delay."""
        return self._file.flush_delay

    def flush(self) -> None:
        """Write what is not on disk yet, now (validated, atomic); raises NotebookError."""
        self._file.flush()

    def take_turn(self) -> None:
        """Hold the notebook's write lock until :meth:`flush_turn`, so that what this
        recorder holds now is written before any other writer's next cells (a recorder
        with a ``flush_delay`` only; see :meth:`NotebookFile.take_turn
        <kernel_sandbox.notebook.file.NotebookFile.take_turn>`)."""
        self._file.take_turn()

    def flush_turn(self) -> None:
        """Write what is not on disk yet under the turn :meth:`take_turn` took, and let
        go of it."""
        self._file.flush_turn()

    def keep_turn(self) -> None:
        """Take the notebook's write lock unless this recorder keeps it already, and keep
        it while its steps come: they are written behind, coalescing, before any other
        writer's next cells; another writer that wants it has it at once (a recorder with
        a ``flush_delay`` only; see :meth:`NotebookFile.keep_turn
        <kernel_sandbox.notebook.file.NotebookFile.keep_turn>`)."""
        self._file.keep_turn()

    @property
    def keeps_turn(self) -> bool:
        """Whether this recorder keeps the notebook's turn now (:meth:`keep_turn`)."""
        return self._file.keeps_turn

    def settle(self) -> None:
        """Write what is not on disk yet, and wait until no other process is writing the
        notebook (one that keeps its turn writes and lets go): the file then holds every
        cell whose writer took its turn before."""
        self.flush()
        with shared.locked(self.path):
            pass

    def close(self) -> None:
        """Write what is pending; the recorder can still record afterwards."""
        self.flush()

    def nudge(self) -> None:
        """Tell watchers something outside the notebook changed (a running cell's
        outputs on the live page); nothing is recorded or written."""
        with self._lock:
            self.version += 1
            self._notify()

    def watch(self, callback: Any) -> None:
        """Call ``callback()`` (from the recording thread) after every change."""
        self._watchers.append(callback)

    def unwatch(self, callback: Any) -> None:
        """Stop calling ``callback``."""
        if callback in self._watchers:
            self._watchers.remove(callback)

    # -- reading ----------------------------------------------------------------------

    @property
    def notebook(self) -> NotebookNode:
        """A copy of the notebook as recorded so far."""
        with self._lock:
            return nbformat.from_dict(jsonable(self._nb))

    def cell_count(self) -> int:
        """Cells recorded so far (cheap: no copy)."""
        with self._lock:
            return len(self._nb.cells)

    def notebook_meta(self) -> dict[str, Any]:
        """A copy of the session's ``kernel_sandbox`` metadata (status, times...)."""
        with self._lock:
            return dict(jsonable(self._nb.metadata[META_KEY]))

    @property
    def steps(self) -> int:
        """Number of recorded steps (cells added)."""
        return self._steps

    def __repr__(self) -> str:
        return f"<NotebookRecorder {str(self.path)!r} steps={self._steps}>"

    # -- internals --------------------------------------------------------------------

    def _append(self, cell: NotebookNode) -> None:
        with self._lock:
            self._nb.cells.append(cell)
            self._step()

    def _step(self) -> None:
        self._steps += 1
        self._nb.metadata[META_KEY]["steps"] = self._steps
        self._save()

    def _notify(self) -> None:
        for callback in list(self._watchers):
            try:
                callback()
            except Exception:  # a watcher must never break recording
                self._watchers.remove(callback)

    def _save(self) -> None:
        self._nb.metadata[META_KEY]["updated_at"] = iso_time()
        self.version += 1
        self._notify()
        self._file.changed()
