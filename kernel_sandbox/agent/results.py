"""What an agent task gives back, shared by the agent and its loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..sync import as_async
from .budget import BudgetKind, TokenUsage

if TYPE_CHECKING:
    from ..protocols import SandboxLike
    from ..sync import Sandbox

__all__ = ["AgentResult", "AgentStatus", "borrowed"]

AgentStatus = Literal["completed", "budget_exhausted", "error"]


@dataclass(frozen=True)
class AgentResult:
    """How one task (one prompt) ended.

    ``status`` is ``completed`` (the model answered in plain text), ``budget_exhausted``
    (``budget`` says which limit; ``answer`` says so too) or ``error`` (the model API
    kept failing; ``reason`` says why).  The notebook at ``notebook_path`` is valid in
    every case.
    """

    status: AgentStatus
    answer: str
    session_id: str
    reason: str = ""
    budget: BudgetKind | None = None
    turns: int = 0
    tool_calls: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    duration: float = 0.0
    notebook_path: Path | None = None

    @property
    def ok(self) -> bool:
        """True when the model gave its answer."""
        return self.status == "completed"


def borrowed(sandbox: SandboxLike | Sandbox | None) -> SandboxLike | None:
    """The async sandbox behind ``sandbox`` (async or blocking), or None."""
    return as_async(sandbox) if sandbox is not None else None
