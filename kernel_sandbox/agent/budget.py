"""Budgets and retries: what bounds an agent session, and how model API errors are retried.

A :class:`Budget` caps one task (one prompt) by model calls, total tokens (as reported
in ``usage``) and wall time; a :class:`BudgetTracker` counts against it and says which
limit was reached.  A :class:`RetryPolicy` decides which model API errors are worth
another try (rate limits, timeouts, 5xx, dropped connections) and how long to wait; the
retry loop itself is ``tenacity``'s (:meth:`RetryPolicy.retrying`).  Nothing here talks
to a model or a sandbox, so all of it is unit-tested without either.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import openai
import tenacity
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Budget",
    "BudgetHit",
    "BudgetKind",
    "BudgetTracker",
    "RetryCallback",
    "RetryPolicy",
    "TokenUsage",
    "describe_api_error",
]

BudgetKind = Literal["turns", "tokens", "time"]


class Budget(BaseModel):
    """Limits for one task; ``None`` means no limit of that kind.

    ``max_turns`` counts model calls, ``max_tokens`` the total tokens the endpoint
    reports in ``usage`` (prompt + completion, summed over calls), ``max_time`` wall
    seconds.  Limits are checked between steps: a running tool call is not cut short,
    but a model call never waits past the time limit.  An endpoint that reports no
    ``usage`` counts as zero tokens, so ``max_tokens`` then never triggers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int | None = Field(default=20, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_time: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class TokenUsage:
    """Tokens reported by the endpoint; endpoints that report none count as zero."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
        )

    @classmethod
    def of(cls, usage: object) -> TokenUsage:
        """From an SDK ``CompletionUsage`` (or None); a missing total is the sum."""
        if usage is None:
            return cls()
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        total = int(getattr(usage, "total_tokens", 0) or 0) or prompt + completion
        return cls(prompt, completion, total)


@dataclass(frozen=True)
class BudgetHit:
    """Which limit ended a task, and a sentence saying so."""

    kind: BudgetKind
    limit: float
    used: float

    @property
    def message(self) -> str:
        """E.g. ``the turn budget was reached (3 model calls, max_turns=3)``."""
        if self.kind == "turns":
            used = f"{int(self.used)} model calls, max_turns={int(self.limit)}"
        elif self.kind == "tokens":
            used = f"{int(self.used):,} tokens used, max_tokens={int(self.limit):,}"
        else:
            used = f"{self.used:.1f} s elapsed, max_time={self.limit:g} s"
        noun = {"turns": "turn", "tokens": "token", "time": "time"}[self.kind]
        return f"the {noun} budget was reached ({used})"


@dataclass
class BudgetTracker:
    """Counts one task's turns, tokens and time against a :class:`Budget`."""

    budget: Budget
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    turns: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self._now()

    def _now(self) -> float:
        return float(self.clock())

    @property
    def elapsed(self) -> float:
        """Seconds since the task started."""
        return self._now() - self.started

    def remaining_time(self) -> float | None:
        """Seconds left before the time limit, or None without one."""
        if self.budget.max_time is None:
            return None
        return max(0.0, self.budget.max_time - self.elapsed)

    def add_turn(self, usage: TokenUsage) -> None:
        """Count one model call and the tokens it used."""
        self.turns += 1
        self.usage = self.usage + usage

    def time_hit(self) -> BudgetHit | None:
        """The time limit, if it is reached."""
        limit = self.budget.max_time
        if limit is not None and self.elapsed >= limit:
            return BudgetHit("time", limit, self.elapsed)
        return None

    def exhausted(self) -> BudgetHit | None:
        """The first limit that forbids another model call, or None."""
        b = self.budget
        if b.max_turns is not None and self.turns >= b.max_turns:
            return BudgetHit("turns", b.max_turns, self.turns)
        if b.max_tokens is not None and self.usage.total_tokens >= b.max_tokens:
            return BudgetHit("tokens", b.max_tokens, self.usage.total_tokens)
        return self.time_hit()


_RETRY_STATUSES = frozenset({408, 409, 429})


RetryCallback = Callable[[int, float, BaseException], Awaitable[None]]
"""Told ``(failed attempt number, seconds until the next one, the error)`` before a retry."""


class RetryPolicy(BaseModel):
    """How model API errors are retried: exponential backoff, a bounded number of times.

    Retried: rate limits (429), request timeouts (408), conflicts (409), server errors
    (5xx), timeouts and dropped connections.  Not retried: everything that will fail
    the same way again (bad request, authentication, unknown model...).  A server's
    ``Retry-After`` is honoured up to ``max_delay``.

    Why ``tenacity`` and not the openai SDK's own ``max_retries``: the SDK's backoff
    (0.5 s doubling to 8 s) cannot be configured and it retries silently, while the agent
    reports every retry (:class:`~kernel_sandbox.agent.events.ModelRetrying`, shown by the
    CLI) and lets users set the delays.  The SDK's retries are therefore switched off
    (``max_retries=0`` in :meth:`Agent.make_client`) so that requests are not retried twice.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_retries: int = Field(default=4, ge=0, description="Retries after the first attempt.")
    initial_delay: float = Field(default=1.0, ge=0)
    max_delay: float = Field(default=30.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1)
    jitter: float = Field(default=0.1, ge=0, le=1, description="Up to this fraction is added.")
    request_timeout: float = Field(default=120.0, gt=0, description="Seconds per model call.")

    def is_retryable(self, exc: BaseException) -> bool:
        """True for errors that may go away if the same request is sent again."""
        if isinstance(exc, openai.APIConnectionError | TimeoutError):
            return True  # APITimeoutError is an APIConnectionError
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code in _RETRY_STATUSES or exc.status_code >= 500
        return False

    def retrying(self, on_retry: RetryCallback | None = None) -> tenacity.AsyncRetrying:
        """A tenacity retrier for one model call: ``await policy.retrying(cb)(fn)``.

        It re-raises the last error when retries run out or the error is not
        retryable; ``on_retry`` is awaited before each wait (the agent emits its event).
        ``fn`` must be an ``async def``: tenacity awaits only coroutine functions, not a
        plain callable that returns an awaitable (such as the SDK's ``create``).
        """

        async def before_sleep(state: tenacity.RetryCallState) -> None:
            if on_retry is not None and state.outcome is not None:
                error = state.outcome.exception()
                assert error is not None  # only failed attempts are retried
                await on_retry(state.attempt_number, state.upcoming_sleep, error)

        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(self.is_retryable),
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=_Backoff(self),
            before_sleep=before_sleep,
            reraise=True,
        )

    def delay(self, retry: int, exc: BaseException | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): the hint, else backoff."""
        hinted = _retry_after(exc) if exc is not None else None
        if hinted is not None:
            return min(hinted, self.max_delay)
        base = self.initial_delay * self.multiplier ** (retry - 1)
        return min(base * (1 + self.jitter * random.random()), self.max_delay)


class _Backoff(tenacity.wait.wait_base):
    """tenacity's wait hook: :meth:`RetryPolicy.delay` for the attempt that just failed."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        return self.policy.delay(retry_state.attempt_number, error)


def _retry_after(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` / ``retry-after-ms`` hint in seconds, if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - time.time())


def describe_api_error(exc: BaseException) -> str:
    """One line for a failed model call: what happened, and what to check."""
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return "the model call timed out; check the endpoint, or raise request_timeout"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"cannot connect to the model endpoint{detail}; check base_url and the network"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        message = exc.message
        if isinstance(body, dict):
            inner = body.get("error", body)
            if isinstance(inner, dict) and inner.get("message"):
                message = str(inner["message"])
        hint = {
            401: "; check the API key (OPENAI_API_KEY or --api-key)",
            403: "; the key may lack access to this model",
            404: "; check the model name and base_url",
            429: "; the endpoint is rate limiting: wait, or lower the request rate",
        }.get(exc.status_code, "")
        if exc.status_code >= 500 and not hint:
            hint = "; the endpoint had a server error"
        return f"HTTP {exc.status_code}: {message}{hint}"
    return f"{type(exc).__name__}: {exc}"
