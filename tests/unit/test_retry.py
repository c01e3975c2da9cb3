"""RetryPolicy (tenacity underneath) against the real openai client and the local server.

Each test drives ``AsyncOpenAI`` (its own retries off, as the agent makes it) over HTTP
to ``tests/openai_server.py`` through :meth:`RetryPolicy.retrying`, and checks what a
user notices: which errors are retried, how long the waits are announced to be
(``Retry-After`` first, else exponential backoff), and the error that ends it.
"""

from __future__ import annotations

import socket

import openai
import pytest
from openai import AsyncOpenAI

from kernel_sandbox.agent import RetryPolicy
from kernel_sandbox.agent.budget import describe_api_error
from tests.openai_server import Reply, ScriptedOpenAIServer, error, text

MESSAGES = [{"role": "user", "content": "hi"}]


def bare_error(status: int, **headers: str) -> Reply:
    """An API error with only the given headers (``error()`` adds ``retry-after-ms: 1``)."""
    body = {"error": {"message": f"bare {status}", "type": "x"}}
    return Reply(status=status, body=body, headers=headers)


async def ask(
    base_url: str, policy: RetryPolicy, announced: list[tuple[int, float, str]] | None = None
) -> tuple[object, list[tuple[int, float, str]]]:
    """One chat completion through the policy; returns it and the announced retries."""
    announced = [] if announced is None else announced

    async def on_retry(attempt: int, delay: float, exc: BaseException) -> None:
        announced.append((attempt, delay, describe_api_error(exc)))

    client = AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=5)

    async def create() -> object:  # tenacity awaits only what an `async def` returns
        return await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    try:
        completion = await policy.retrying(on_retry)(create)
    finally:
        await client.close()
    return completion, announced


async def test_retry_after_from_the_server_is_honoured_before_the_backoff():
    policy = RetryPolicy(max_retries=2, initial_delay=20, max_delay=60)
    hinted = error(429, "slow down", headers={"retry-after-ms": "30"})
    with ScriptedOpenAIServer([hinted, text("ok")]) as server:
        completion, announced = await ask(server.base_url, policy)
    assert completion.choices[0].message.content == "ok"  # type: ignore[attr-defined]
    assert [(a, round(d, 3)) for a, d, _ in announced] == [(1, 0.03)]
    assert "HTTP 429: slow down" in announced[0][2]
    assert len(server.chat_requests) == 2


async def test_a_long_retry_after_is_capped_by_max_delay():
    policy = RetryPolicy(max_retries=1, initial_delay=0.01, max_delay=0.05)
    with ScriptedOpenAIServer([bare_error(503, **{"retry-after": "3600"}), text("ok")]) as server:
        _, announced = await ask(server.base_url, policy)
    assert [d for _, d, _ in announced] == [0.05]


async def test_without_a_hint_the_waits_grow_exponentially_up_to_max_delay():
    policy = RetryPolicy(max_retries=4, initial_delay=0.01, multiplier=2, max_delay=0.05, jitter=0)
    with ScriptedOpenAIServer([bare_error(500)] * 4 + [text("ok")]) as server:
        _, announced = await ask(server.base_url, policy)
    assert [round(d, 3) for _, d, _ in announced] == [0.01, 0.02, 0.04, 0.05]
    assert [a for a, _, _ in announced] == [1, 2, 3, 4]


async def test_when_retries_run_out_the_last_api_error_is_raised():
    policy = RetryPolicy(max_retries=2, initial_delay=0.001)
    script = [error(500, "first"), error(502, "second"), error(500, "last")]
    with (
        ScriptedOpenAIServer(script) as server,
        pytest.raises(openai.InternalServerError) as caught,
    ):
        await ask(server.base_url, policy)
    assert "HTTP 500: last" in describe_api_error(caught.value)
    assert len(server.chat_requests) == 3


async def test_errors_that_will_fail_again_are_not_retried():
    policy = RetryPolicy(max_retries=3, initial_delay=0.001)
    for status, kind in [(400, openai.BadRequestError), (401, openai.AuthenticationError)]:
        script = [error(status, "no"), text("never sent")]
        with ScriptedOpenAIServer(script) as server, pytest.raises(kind):
            await ask(server.base_url, policy)
        assert len(server.chat_requests) == 1


async def test_a_dropped_connection_is_retried_then_reported():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = RetryPolicy(max_retries=2, initial_delay=0.001)
    announced: list[tuple[int, float, str]] = []
    with pytest.raises(openai.APIConnectionError) as caught:
        await ask(f"http://127.0.0.1:{port}/v1", policy, announced)
    assert [a for a, _, _ in announced] == [1, 2]
    assert "cannot connect to the model endpoint" in describe_api_error(caught.value)
