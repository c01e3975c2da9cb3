"""An LLM agent that works in a sandbox and leaves a notebook behind.

- :class:`Agent` holds the model settings (any OpenAI-compatible endpoint) and the
  sandbox / tools / recording options; :meth:`Agent.run` (blocking) and
  :meth:`Agent.arun` handle one prompt.
- :class:`AgentSession` is the multi-round tool-calling loop over one sandbox and one
  notebook; several prompts may follow each other in it.
- :class:`Budget` and :class:`RetryPolicy` bound a task and the model API retries;
  :mod:`~kernel_sandbox.agent.events` are what subscribers receive.
"""

from .._extras import require_extra

with require_extra("agent", "kernel_sandbox.agent"):
    from .agent import DEFAULT_MODEL, MODEL_ENV, Agent, AgentResult, AgentStatus
    from .budget import Budget, BudgetHit, BudgetTracker, RetryPolicy, TokenUsage
    from .events import (
        AgentEvent,
        AgentListener,
        AnswerGiven,
        BudgetExhausted,
        ModelFailed,
        ModelResponded,
        ModelRetrying,
        SessionEnded,
        SessionStarted,
        ToolCallFinished,
        ToolCallStarted,
        TurnStarted,
    )
    from .loop import AgentSession
    from .messages import system_prompt
    from .resume import ResumeDivergedError, resume_session

__all__ = [
    "DEFAULT_MODEL",
    "MODEL_ENV",
    "Agent",
    "AgentEvent",
    "AgentListener",
    "AgentResult",
    "AgentSession",
    "AgentStatus",
    "AnswerGiven",
    "Budget",
    "BudgetExhausted",
    "BudgetHit",
    "BudgetTracker",
    "ModelFailed",
    "ModelResponded",
    "ModelRetrying",
    "ResumeDivergedError",
    "RetryPolicy",
    "SessionEnded",
    "SessionStarted",
    "TokenUsage",
    "ToolCallFinished",
    "ToolCallStarted",
    "TurnStarted",
    "resume_session",
    "system_prompt",
]
