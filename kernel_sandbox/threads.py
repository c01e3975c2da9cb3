"""Worker threads for blocking calls (engine SDKs, files), safe across ``fork()``.

``asyncio.to_thread`` uses the running loop's default executor.  A process that used
sandboxes and then forks (``multiprocessing``'s fork start method, as nbclient's
parallel notebooks do) hands the child that loop with an executor whose threads did not
survive the fork: the child's first blocking call waits for ever.  :func:`in_thread`
uses an executor of its own instead, made afresh in a forked child, and
:func:`after_fork` lets the other owners of per-process state (the ZMQ context, the
engines' clients) forget theirs in the child the same way.

A blocking call holds its thread for as long as it lasts: an engine call, but also a
shell command or a file transfer beside the kernel (minutes, if the command says so).
On a server one tenant's long calls must not take the threads another tenant's calls
need, so work done on behalf of an *owner* (:func:`owned_by`: the server sets the
caller's key id for each request, and every task the request starts inherits it) runs
on that owner's own executor of :data:`MAX_WORKERS` threads: a key can fill its own,
never another's.  Owners are the server's keys, a bounded set; work of no owner (a
program's own sandboxes, the server's background work) keeps the shared executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .limits import THREAD_WORKERS as MAX_WORKERS

__all__ = ["after_fork", "executor", "in_thread", "owned_by"]

T = TypeVar("T")


_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
#: Each owner's executor (see the module docstring), made on its first call.
_owned: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_owner: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kernel_sandbox_thread_owner", default=None
)


@contextlib.contextmanager
def owned_by(owner: str) -> Iterator[None]:
    """Within this block (and in the tasks it starts), blocking calls run on
    ``owner``'s own executor instead of the shared one."""
    token = _owner.set(owner)
    try:
        yield
    finally:
        _owner.reset(token)


def executor(owner: str | None = None) -> concurrent.futures.ThreadPoolExecutor:
    """The executor for blocking calls of ``owner`` (None: the process's shared one);
    made on first use, and afresh after a fork."""
    global _executor
    with _lock:
        if owner is not None:
            pool = _owned.get(owner)
            if pool is None:
                pool = _owned[owner] = concurrent.futures.ThreadPoolExecutor(
                    MAX_WORKERS, thread_name_prefix=f"kernel-sandbox-{owner[:16]}"
                )
            return pool
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                MAX_WORKERS, thread_name_prefix="kernel-sandbox"
            )
        return _executor


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread`` on :func:`executor` of the current owner (the caller's
    context variables kept)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    pool = executor(_owner.get())
    return await asyncio.get_running_loop().run_in_executor(pool, call)


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
    _owned.clear()


after_fork(_forget_executor)
