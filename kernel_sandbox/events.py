"""Events: how a sandbox (and the agent loop) tells listeners what happened.

Listeners are plain callables (sync or async) that receive one event object; the
notebook recorder is one of them.  Nothing here knows who listens.

The sandbox emits every event itself (executions, shell commands, every file
operation, restarts), whoever called it.  A caller that acts for someone (a tool call
of a model, a request of a server) says so with :func:`call_context`; every event
emitted inside carries that context in its ``metadata``, so listeners can tell which
call caused what without being fed by the caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .contexts import Context
from .results import CommandResult, Execution

__all__ = [
    "ContextChanged",
    "EgressRefused",
    "Event",
    "FileOperated",
    "KernelRestarted",
    "Listener",
    "PythonExecuted",
    "ShellExecuted",
    "call_context",
    "current_context",
    "emit",
]

log = logging.getLogger(__name__)


_context: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "kernel_sandbox_call_context", default=None
)


@contextlib.contextmanager
def call_context(**fields: Any) -> Iterator[Mapping[str, Any]]:
    """Tag every sandbox event emitted inside the block with ``fields`` (e.g. a tool
    call's ``tool_call_id``, ``tool``, ``turn``).  Nested blocks add to the outer one;
    the context follows asyncio tasks started inside (contextvars)."""
    merged = {**(_context.get() or {}), **fields}
    token = _context.set(merged)
    try:
        yield merged
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    """The fields of the innermost :func:`call_context` (empty outside any)."""
    return dict(_context.get() or {})


@dataclass(frozen=True)
class Event:
    """Base of every event; ``sandbox_id`` says where it happened."""

    sandbox_id: str


@dataclass(frozen=True)
class PythonExecuted(Event):
    """``run_code`` (or ``run_python``) finished, in any status and any language."""

    code: str
    execution: Execution
    started_at: float
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The language it ran in (``python``, ``r``, ``javascript``, ...).
    language: str = "python"
    #: The kernelspec that ran it.
    kernel: str = "python3"
    #: The context (kernel) of the sandbox it ran in; ``"default"``: the sandbox's own.
    context_id: str = "default"


@dataclass(frozen=True)
class ContextChanged(Event):
    """A context (another kernel of the sandbox) was created or removed."""

    context: Context
    change: Literal["created", "removed"]
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
class KernelRestarted(Event):
    """The kernel was restarted (asked for, or after it died or got stuck): variables
    are lost; with ``whole`` the whole sandbox was restarted and files may be lost too.
    ``message`` says why and what was lost."""

    message: str
    whole: bool
    started_at: float
    #: True for ``restart()``; False when a call restarted a dead or stuck kernel (its
    #: ``Execution.message`` says so too).
    requested: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EgressRefused(Event):
    """The sandbox's egress proxy refused connections during the last call.

    ``refusals`` are :class:`~kernel_sandbox.network.Decision` records (host, port,
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
