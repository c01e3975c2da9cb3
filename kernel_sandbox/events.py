"""Events: how a sandbox (and later the agent loop) tells listeners what happened.

Listeners are plain callables (sync or async) that receive one event object; the
notebook recorder is one of them.  Nothing here knows who listens.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .results import CommandResult, Execution

__all__ = [
    "EgressRefused",
    "Event",
    "FileOperated",
    "Listener",
    "PythonExecuted",
    "ShellExecuted",
    "emit",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """Base of every event; ``sandbox_id`` says where it happened."""

    sandbox_id: str


@dataclass(frozen=True)
class PythonExecuted(Event):
    """``run_python`` finished (in any status)."""

    code: str
    execution: Execution
    started_at: float
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ShellExecuted(Event):
    """``run_shell`` finished."""

    command: str
    result: CommandResult
    started_at: float
    cwd: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FileOperated(Event):
    """A file operation finished; ``error`` is empty when it succeeded.

    ``content`` is what a write or append put into the file (so a recorder can redo it).
    """

    operation: str
    path: str
    started_at: float
    size: int | None = None
    error: str = ""
    detail: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    content: bytes | str | None = None


@dataclass(frozen=True)
class EgressRefused(Event):
    """The sandbox's egress proxy refused connections during the last call.

    ``refusals`` are :class:`~kernel_sandbox.egress.Decision` records (host, port,
    why); ``policy`` is the sandbox's ``network`` setting.
    """

    refusals: tuple[Any, ...]
    policy: str

    def sentence(self) -> str:
        """One line per refused destination, for a notebook note or a log."""
        lines = [f"- {d.host}:{d.port} ({d.method}): {d.detail}" for d in self.refusals]
        return (
            f"**network policy** ({self.policy}) refused {len(self.refusals)} "
            "connection(s):\n" + "\n".join(lines)
        )


Listener = Callable[[Event], Any]


async def emit(listeners: Sequence[Callable[[Any], Any]], event: object) -> None:
    """Deliver ``event`` to every listener; a failing listener is logged, never raised.

    Used for sandbox events and for the agent loop's events alike.
    """
    for listener in list(listeners):
        try:
            result = listener(event)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.warning("event listener %r failed", listener, exc_info=True)
