"""tests/waiting.py: the one wait-for-a-condition helper of the tests, sync and async."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import await_for, wait_for


def test_wait_for_returns_the_first_truthy_answer() -> None:
    answers = iter([0, "", "ready", "later"])
    assert wait_for(lambda: next(answers), 10, 0.001) == "ready"


def test_wait_for_names_what_it_waited_for_when_time_is_up() -> None:
    asked = itertools.count()
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the moon"):
        wait_for(lambda: next(asked) < 0, 0.05, 0.01, "the moon")
    assert next(asked) >= 2  # asked again until the deadline, and once at it


async def test_await_for_awaits_a_coroutine_predicate() -> None:
    answers = iter([None, None, 42])

    async def answer() -> int | None:
        return next(answers)

    assert await await_for(answer, 10, 0.001) == 42


async def test_await_for_takes_a_plain_predicate_and_fails_in_time() -> None:
    assert await await_for(lambda: "at once") == "at once"
    with pytest.raises(AssertionError, match="waiting for the sandbox"):
        await await_for(lambda: False, 0.05, 0.01, "the sandbox")
