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

A call that lasts as long as a process in a sandbox does (an exec: a shell command, a
streamed E2B command, a directory watch) may hold its thread for hours, so it takes no
executor thread at all: :func:`in_process_thread` gives it a thread of its own, at most
:data:`~kernel_sandbox.limits.PROCESS_THREADS` per owner at once, and refuses the next
(:class:`~kernel_sandbox.errors.CapacityError`) rather than queue it behind the others.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from .errors import CapacityError
from .limits import PROCESS_THREADS
from .limits import THREAD_WORKERS as MAX_WORKERS

__all__ = ["after_fork", "executor", "in_process_thread", "in_thread", "owned_by"]

T = TypeVar("T")


_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
#: Each owner's executor (see the module docstring), made on its first call.
_owned: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
#: Threads of :func:`in_process_thread` each owner holds now.
_processes: collections.Counter[str | None] = collections.Counter()
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


async def in_process_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` on a thread of its own, for a call that lasts as long as a process in a
    sandbox (see the module docstring); the caller's context variables kept.

    Cancelling the caller does not stop the thread (as with ``in_thread``): the caller
    closes what the thread waits on.  The thread counts against its owner until it ends.
    """
    owner = _owner.get()
    with _lock:
        if _processes[owner] >= PROCESS_THREADS:
            raise CapacityError(
                f"{PROCESS_THREADS} processes beside the kernel already run for this "
                "caller (shell commands, streamed commands, watches); wait for one to end"
            )
        _processes[owner] += 1
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if isinstance(error, concurrent.futures.CancelledError):
            done.cancel()  # as run_in_executor does: a call given up (its waiter went)
        elif error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(T, result))

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as exc:  # handed to the caller, as run_in_executor does
            error = exc
        finally:
            with _lock:
                _processes[owner] -= 1
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    name = "kernel-sandbox-process" + (f"-{owner[:16]}" if owner else "")
    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


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
    _processes.clear()  # their threads did not come along either


after_fork(_forget_executor)
