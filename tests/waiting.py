"""Waiting on a condition with a deadline: the one helper of every tier's tests.

A test that needs something to have happened (a cell to have started, a file to be
written, a container to be gone) asks for it with :func:`wait_for` (blocking) or
:func:`await_for` (in a coroutine; the predicate may be a coroutine function) instead
of sleeping and hoping. Both return the predicate's first truthy value, look once more
at the deadline (a condition met late still counts), and fail with an
``AssertionError`` that names what was waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["await_for", "wait_for"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "the condition",
) -> T:
    """``predicate()`` once it is truthy, asked every ``interval`` seconds for ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        late = time.monotonic() >= deadline
        if value := predicate():
            return value
        if late:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@overload
async def await_for(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...
@overload
async def await_for(
    predicate: Callable[[], T],
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...
async def await_for(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "the condition",
) -> Any:
    """:func:`wait_for` in a coroutine: sleeps with ``asyncio``, awaits an awaitable answer."""
    deadline = time.monotonic() + timeout
    while True:
        late = time.monotonic() >= deadline
        answer = predicate()
        value = await answer if inspect.isawaitable(answer) else answer
        if value:
            return value
        if late:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
