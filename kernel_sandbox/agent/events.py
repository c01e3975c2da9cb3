"""Agent events: what a session tells its subscribers, step by step.

Subscribers are plain callables, sync or async, taking one event; pass them as
``Agent(listeners=[...])`` or append to ``session.listeners``.  A CLI prints progress
from them, a UI streams them.  A failing subscriber is logged and never breaks the
session.  The notebook is not written from these events but by the session itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tools.results import ToolResult
from .budget import BudgetKind, TokenUsage

__all__ = [
    "AgentEvent",
    "AgentListener",
    "AnswerGiven",
    "BudgetExhausted",
    "ModelFailed",
    "ModelResponded",
    "ModelRetrying",
    "SessionEnded",
    "SessionStarted",
    "ToolCallFinished",
    "ToolCallStarted",
    "TurnStarted",
]


@dataclass(frozen=True, kw_only=True)
class AgentEvent:
    """Base of every agent event: which session, and when (``time.time()``)."""

    session_id: str
    at: float = field(default_factory=time.time)


@dataclass(frozen=True, kw_only=True)
class SessionStarted(AgentEvent):
    """The sandbox is ready and the notebook (if any) exists."""

    model: str
    sandbox_id: str
    image: str
    notebook_path: Path | None


@dataclass(frozen=True, kw_only=True)
class TurnStarted(AgentEvent):
    """A model call is about to be made (turn numbers start at 1 for each task)."""

    turn: int


@dataclass(frozen=True, kw_only=True)
class ModelRetrying(AgentEvent):
    """A model call failed with a retryable error; the next attempt follows ``delay``."""

    turn: int
    attempt: int
    delay: float
    error: str


@dataclass(frozen=True, kw_only=True)
class ModelResponded(AgentEvent):
    """The model answered: text, tool calls, or both."""

    turn: int
    text: str
    tool_calls: list[dict[str, Any]]
    usage: TokenUsage
    finish_reason: str | None
    duration: float


@dataclass(frozen=True, kw_only=True)
class ToolCallStarted(AgentEvent):
    """One tool call is about to run in the sandbox (``arguments`` as the model sent them)."""

    turn: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class ToolCallFinished(AgentEvent):
    """One tool call finished; ``result`` has the output, errors included."""

    turn: int
    call_id: str
    name: str
    result: ToolResult


@dataclass(frozen=True, kw_only=True)
class AnswerGiven(AgentEvent):
    """The model answered in plain text: the task is done."""

    text: str


@dataclass(frozen=True, kw_only=True)
class BudgetExhausted(AgentEvent):
    """A limit stopped the task before the model answered."""

    kind: BudgetKind
    message: str


@dataclass(frozen=True, kw_only=True)
class ModelFailed(AgentEvent):
    """The model API kept failing (or failed in a way retrying cannot fix)."""

    error: str
    attempts: int


@dataclass(frozen=True, kw_only=True)
class SessionEnded(AgentEvent):
    """A task ended: ``status`` is ``completed``, ``budget_exhausted`` or ``error``."""

    status: str
    reason: str
    notebook_path: Path | None


AgentListener = Callable[[AgentEvent], Any]
