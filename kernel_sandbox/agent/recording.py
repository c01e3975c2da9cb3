"""How an agent session feeds its notebook recorder.

The session's :class:`Recording` listens to the sandbox.  While a tool call runs, the
sandbox events it causes are tagged with the call's id, tool, turn and model, then
handed to the :class:`~kernel_sandbox.notebook.NotebookRecorder`, which turns them into
cells.  When the call ends, the tool's verdict (status, error, time) is merged into the
same cell; a call that never reached the sandbox (unknown tool, bad arguments) becomes
a note showing what the model sent.  Recording failures are logged and never end a task.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..events import Event, FileOperated, PythonExecuted, ShellExecuted
from ..notebook import NotebookRecorder
from ..tools import ToolResult
from .messages import ParsedCall

__all__ = ["Recording"]

log = logging.getLogger(__name__)

_WRITES = ("write", "append")


class Recording:
    """The bridge between one session, its sandbox's events and its recorder (if any)."""

    def __init__(self, recorder: NotebookRecorder | None = None) -> None:
        self.recorder = recorder
        self._context: dict[str, Any] | None = None
        self._captured: list[Event] = []

    @property
    def path(self) -> Path | None:
        """The notebook file, or None when recording is off."""
        return self.recorder.path if self.recorder else None

    def step(self, method: Callable[..., object], *args: Any) -> None:
        """Call one recorder method, e.g. ``step(NotebookRecorder.add_note, "text")``."""
        if self.recorder is None:
            return
        try:
            method(self.recorder, *args)
        except Exception:
            log.warning("recording to %s failed", self.recorder.path, exc_info=True)

    def on_sandbox_event(self, event: Event) -> None:
        """Sandbox listener: tag the events of the running tool call, then record them."""
        context = self._context
        if context is not None:
            metadata = {**getattr(event, "metadata", {}), **context}
            event = dataclasses.replace(event, metadata=metadata)  # type: ignore[call-arg]
            self._captured.append(event)
        if self.recorder is not None:
            self.recorder(event)

    def begin_call(self, context: dict[str, Any]) -> None:
        """A tool call starts: its sandbox events get ``context`` in their cell metadata."""
        self._context, self._captured = context, []

    def end_call(self, call: ParsedCall, result: ToolResult) -> None:
        """A tool call ended: merge its verdict into its cells, or note why it did not run."""
        context, captured = self._context or {}, self._captured
        self._context, self._captured = None, []
        recorder = self.recorder
        if recorder is None:
            return
        extra: dict[str, Any] = {
            "tool_status": result.status,
            "execution_time": round(result.execution_time, 4),
        }
        if result.error:
            extra["tool_error"] = result.error
        try:
            for event in captured:  # the same result again: the recorder merges metadata
                if isinstance(event, PythonExecuted):
                    recorder.add_python(event.code, event.execution, extra)
                elif isinstance(event, ShellExecuted):
                    recorder.add_shell(event.command, event.result, extra, cwd=event.cwd)
                elif isinstance(event, FileOperated):
                    # the event has no file content but the call's arguments do, so
                    # the notebook can redo the write (a %%writefile cell)
                    recorder.add_file_operation(
                        event.operation,
                        event.path,
                        content=written_content(call) if event.operation in _WRITES else None,
                        size=event.size,
                        error=event.error,
                        detail=event.detail,
                        metadata=extra,
                        started_at=event.started_at,
                    )
            if not captured:
                recorder.add_note(failed_call_note(call, result), {**context, **extra})
        except Exception:
            log.warning("recording tool call %s failed", call.id, exc_info=True)


def written_content(call: ParsedCall) -> str | None:
    """The ``content`` argument of a file_operation write, if the call has one."""
    try:
        arguments = json.loads(call.arguments)
    except (TypeError, ValueError):
        return None
    content = arguments.get("content") if isinstance(arguments, dict) else None
    return content if isinstance(content, str) else None


def failed_call_note(call: ParsedCall, result: ToolResult) -> str:
    """Markdown for a call that never reached the sandbox (bad name or arguments)."""
    try:
        shown = json.dumps(json.loads(call.arguments), indent=2)
    except (TypeError, ValueError):
        shown = call.arguments
    why = result.error or result.output or result.status
    return (
        f"*Tool call* `{call.name or '?'}` (`{call.id}`) was not executed: {why}\n\n"
        f"```json\n{shown}\n```"
    )
