"""How an agent session records into its notebook, and tags its sandbox's events.

The recorder listens to the sandbox directly (the sandbox emits every event itself).
While a tool call runs, :meth:`Recording.call` puts the call's id, tool, turn and model
into the event context (:func:`~kernel_sandbox.events.call_context`), so the cells the
call causes carry them.  When the call ends, its verdict (status, error, time) is
merged into those cells by id; a call that never reached the sandbox (unknown tool,
bad arguments) becomes a note showing what the model sent.  Recording failures are
logged and never end a task.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..events import call_context
from ..notebook import NotebookRecorder
from ..tools import ToolResult
from .messages import ParsedCall

__all__ = ["Recording"]

log = logging.getLogger(__name__)


class Recording:
    """One session's recorder (if any) and the context of its running tool call."""

    def __init__(self, recorder: NotebookRecorder | None = None) -> None:
        self.recorder = recorder

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

    @contextlib.contextmanager
    def call(self, context: dict[str, Any]) -> Iterator[None]:
        """A tool call runs inside: its sandbox events carry ``context`` (incl. its id)."""
        with call_context(**context):
            yield

    def end_call(self, call: ParsedCall, result: ToolResult) -> None:
        """A tool call ended: merge its verdict into its cells, or note why it did not run."""
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
            if not recorder.finish_call(call.id, extra):
                context = {"tool_call_id": call.id, "tool": call.name}
                recorder.add_note(failed_call_note(call, result), {**context, **extra})
        except Exception:
            log.warning("recording tool call %s failed", call.id, exc_info=True)


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
