"""Budgets and retry policy of the agent loop: no model, no sandbox."""

from __future__ import annotations

import httpx2
import openai
import pytest

from kernel_sandbox.agent import Budget, BudgetTracker, RetryPolicy, TokenUsage
from kernel_sandbox.agent.budget import describe_api_error

_REQUEST = httpx2.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def status_error(status: int, message: str = "boom", **headers: str) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers, request=_REQUEST)
    body = {"error": {"message": message, "type": "x"}}
    cls = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        404: openai.NotFoundError,
        429: openai.RateLimitError,
    }.get(status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return cls(message, response=response, body=body)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_turn_budget_stops_after_max_turns():
    tracker = BudgetTracker(Budget(max_turns=2))
    assert tracker.exhausted() is None
    tracker.add_turn(TokenUsage())
    assert tracker.exhausted() is None
    tracker.add_turn(TokenUsage())
    hit = tracker.exhausted()
    assert hit is not None and hit.kind == "turns"
    assert "turn budget" in hit.message and "max_turns=2" in hit.message


def test_token_budget_counts_reported_usage():
    tracker = BudgetTracker(Budget(max_turns=None, max_tokens=1000))
    tracker.add_turn(TokenUsage(400, 100, 500))
    assert tracker.exhausted() is None
    tracker.add_turn(TokenUsage(450, 100, 550))
    hit = tracker.exhausted()
    assert hit is not None and hit.kind == "tokens"
    assert tracker.usage == TokenUsage(850, 200, 1050)
    assert "1,050 tokens" in hit.message and "max_tokens=1,000" in hit.message


def test_time_budget_uses_the_clock():
    clock = Clock()
    tracker = BudgetTracker(Budget(max_turns=None, max_time=30), clock=clock)
    assert tracker.remaining_time() == 30
    clock.now += 29
    assert tracker.exhausted() is None and tracker.remaining_time() == pytest.approx(1)
    clock.now += 2
    hit = tracker.exhausted()
    assert hit is not None and hit.kind == "time" and "max_time=30 s" in hit.message
    assert tracker.remaining_time() == 0


def test_no_limits_never_exhaust():
    tracker = BudgetTracker(Budget(max_turns=None))
    for _ in range(100):
        tracker.add_turn(TokenUsage(1000, 1000, 2000))
    assert tracker.exhausted() is None and tracker.remaining_time() is None


def test_token_usage_from_sdk_objects_and_missing_usage():
    usage = openai.types.CompletionUsage(prompt_tokens=7, completion_tokens=3, total_tokens=10)
    assert TokenUsage.of(usage) == TokenUsage(7, 3, 10)
    assert TokenUsage.of(None) == TokenUsage()

    class NoTotal:
        prompt_tokens = 4
        completion_tokens = 2
        total_tokens = None

    assert TokenUsage.of(NoTotal()).total_tokens == 6


def test_budget_rejects_nonsense():
    with pytest.raises(ValueError):
        Budget(max_turns=0)
    with pytest.raises(ValueError):
        Budget(max_time=-1)


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (status_error(429), True),
        (status_error(500), True),
        (status_error(503), True),
        (status_error(408), True),
        (status_error(400), False),
        (status_error(401), False),
        (status_error(404), False),
        (openai.APITimeoutError(request=_REQUEST), True),
        (openai.APIConnectionError(request=_REQUEST), True),
        (TimeoutError(), True),
        (ValueError("bug"), False),
    ],
)
def test_which_errors_are_retried(exc, retry):
    assert RetryPolicy().is_retryable(exc) is retry


def test_backoff_grows_exponentially_and_is_capped():
    policy = RetryPolicy(initial_delay=1, multiplier=2, max_delay=5, jitter=0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]


def test_jitter_only_adds_up_to_its_fraction():
    policy = RetryPolicy(initial_delay=1, multiplier=2, max_delay=100, jitter=0.5)
    delays = [policy.delay(3) for _ in range(50)]
    assert all(4 <= d <= 6 for d in delays)


def test_retry_after_headers_are_honoured_and_capped():
    policy = RetryPolicy(initial_delay=10, max_delay=20, jitter=0)
    assert policy.delay(1, status_error(429, **{"retry-after": "3"})) == 3
    assert policy.delay(1, status_error(429, **{"retry-after-ms": "250"})) == 0.25
    assert policy.delay(1, status_error(429, **{"retry-after": "3600"})) == 20
    assert policy.delay(1, status_error(500)) == 10  # no hint: the backoff


def test_api_errors_are_described_with_what_to_check():
    assert "HTTP 429: slow down" in describe_api_error(status_error(429, "slow down"))
    assert "rate limiting" in describe_api_error(status_error(429))
    assert "API key" in describe_api_error(status_error(401))
    assert "model name" in describe_api_error(status_error(404))
    assert "server error" in describe_api_error(status_error(502))
    assert "base_url" in describe_api_error(openai.APIConnectionError(request=_REQUEST))
    assert "timed out" in describe_api_error(openai.APITimeoutError(request=_REQUEST))
