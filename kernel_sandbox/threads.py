"""Worker threads for blocking calls (engine SDKs, files), safe across ``fork()``.

``asyncio.to_thread`` uses the running loop's default executor.  A process that used
sandboxes and then forks (``multiprocessing``'s fork start method, as nbclient's
parallel notebooks do) hands the child that loop with an executor whose threads did not
survive the fork: the child's first blocking call waits for ever.  :func:`in_thread`
uses an executor of its own instead, made afresh in a forked child, and
:func:`after_fork` lets the other owners of per-process state (the ZMQ context, the
engines' clients) forget theirs in the child the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["after_fork", "executor", "in_thread"]

T = TypeVar("T")

#: Worker threads of the shared executor (asyncio's default executor's number).
MAX_WORKERS = min(32, (os.cpu_count() or 1) + 4)

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's executor for blocking calls (made on first use, and after a fork)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                MAX_WORKERS, thread_name_prefix="kernel-sandbox"
            )
        return _executor


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread`` on :func:`executor` (the caller's context variables kept)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor(), call)


def after_fork(forget: Callable[[], None]) -> None:
    """Call ``forget`` in the child of every ``fork()``: drop state bound to the parent.

    ``forget`` must only drop references (never close or join: what it would close is
    the parent's, and its threads are gone).
    """
    os.register_at_fork(after_in_child=forget)


def _forget_executor() -> None:
    global _executor, _lock
    _lock = threading.Lock()  # it may have been held by a thread that is gone
    _executor = None  # its threads are the parent's; the child makes its own


after_fork(_forget_executor)
