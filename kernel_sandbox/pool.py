"""SandboxPool: sandboxes started ahead of time, handed out in milliseconds.

Starting a sandbox costs most of a second (container start, Python and ipykernel
imports).  A pool pays that before anyone asks::

    async with SandboxPool(size=4) as pool:
        async with pool.acquire() as sandbox:      # a ready kernel, in milliseconds
            await sandbox.run_python("x = 1")

A used sandbox is **never** handed to the next borrower: ``release`` destroys it and a
fresh one is started in the background, so no variable, file or process can leak from
one borrower to the next.  The pool also

- keeps ``size`` sandboxes ready, and as many as the recent peak demand needed (up to
  ``max_size`` in total); ready members beyond ``size`` are removed after
  ``idle_timeout`` seconds without use;
- checks idle members every ``health_interval`` seconds (one engine call for the whole
  pool) and asks the kernel of a member before handing it out, so a dead member is
  replaced, never handed out;
- when no member is ready, starts one for the caller (``on_empty="create"``) or waits
  for the next one (``on_empty="wait"``) — ``acquire`` never fails because the pool
  is empty;
- on ``close`` (also when the ``async with`` block is cancelled) removes every
  container it started, handed out or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

from .backends.factory import HostFactory
from .config import LABEL_PREFIX, SandboxConfig
from .errors import ConfigError, SandboxClosedError, SandboxError
from .limits import POOL_PING_SECONDS
from .sandbox import AsyncSandbox

__all__ = ["POOL_LABEL", "PoolStats", "SandboxPool"]

log = logging.getLogger(__name__)

#: Label carrying the pool id on every member's container.
POOL_LABEL = f"{LABEL_PREFIX}.pool"


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool: how many members are where, and what happened so far."""

    idle: int
    in_use: int
    creating: int
    closing: int
    created: int
    create_failures: int
    replaced_dead: int
    reaped: int
    destroyed_after_use: int
    #: Callers waiting in ``acquire`` for a member right now.
    waiting: int = 0

    @property
    def total(self) -> int:
        """Members that count against ``max_size``: ready, handed out or starting."""
        return self.idle + self.in_use + self.creating


@dataclass
class _Idle:
    sandbox: AsyncSandbox
    since: float


class SandboxPool:
    """Keeps sandboxes started with their kernels ready; see the module docstring.

    ``config`` and ``overrides`` describe every member (as for
    :meth:`AsyncSandbox.create`).  ``size`` is the number of ready members the pool
    keeps; ``max_size`` caps members in total (ready + handed out + starting; default
    ``max(4 * size, 4)``); ``create_concurrency`` caps how many start at once.

    ``preimport`` names modules every member imports while it starts, in the
    background: ``("numpy", "pandas", "matplotlib.pyplot")`` takes ~1 s off a
    borrower's first analyst cell, at ~66 MB more per idle member (see bench/).
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        size: int = 2,
        max_size: int | None = None,
        idle_timeout: float = 300.0,
        on_empty: Literal["create", "wait"] = "create",
        health_interval: float = 5.0,
        create_concurrency: int = 4,
        check_on_acquire: bool = True,
        preimport: tuple[str, ...] = (),
        host: str | HostFactory | None = None,
        **overrides: Any,
    ) -> None:
        if size < 0:
            raise ConfigError(f"size={size} must be 0 or more")
        max_size = max(4 * size, 4) if max_size is None else max_size
        if max_size < max(size, 1):
            raise ConfigError(f"max_size={max_size} must be at least size={size} and at least 1")
        if on_empty not in ("create", "wait"):
            raise ConfigError(f"on_empty={on_empty!r} must be 'create' or 'wait'")
        if idle_timeout <= 0 or health_interval <= 0 or create_concurrency < 1:
            raise ConfigError(
                "idle_timeout and health_interval must be > 0 and create_concurrency >= 1"
            )
        self.id = secrets.token_hex(4)
        base = (config or SandboxConfig()).with_overrides(**overrides)
        env = dict(base.env_vars)
        if preimport:
            env["KERNEL_SANDBOX_PREIMPORT"] = ",".join(preimport)
        self.config = base.with_overrides(labels={**base.labels, POOL_LABEL: self.id}, env_vars=env)
        self.size = size
        self.max_size = max_size
        self.idle_timeout = idle_timeout
        self.on_empty = on_empty
        self.health_interval = health_interval
        self.check_on_acquire = check_on_acquire
        #: The kernel host of every member (a name or a factory; None: ``config.host``).
        self.host = host
        self._idle: deque[_Idle] = deque()
        self._in_use: dict[str, AsyncSandbox] = {}
        self._waiters: deque[asyncio.Future[AsyncSandbox]] = deque()
        self._creating: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._create_slots = asyncio.Semaphore(create_concurrency)
        self._peak = 0
        self._peak_at = 0.0
        self._failures = 0
        self._retry_at = 0.0
        self._retry_handle: asyncio.TimerHandle | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._counts = dict.fromkeys(
            ("created", "create_failures", "replaced_dead", "reaped", "destroyed_after_use"), 0
        )

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> SandboxPool:
        """Start ``size`` members in parallel and return once they are ready.

        If none of them can start (no engine, missing image), the error is raised and
        the pool is closed.
        """
        if self._closed:
            raise SandboxClosedError("the pool is closed; create a new one")
        if self._started:
            return self
        self._started = True
        try:
            results = await asyncio.gather(
                *(self._create_member() for _ in range(self.size)), return_exceptions=True
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            for r in results:
                if not isinstance(r, BaseException):
                    self._add_ready(r)
            if errors and len(errors) == len(results):
                raise errors[0]
            for e in errors:
                log.warning("a pool member did not start: %s", e)
            self._health_task = asyncio.create_task(self._health_loop())
            self._fill()
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Remove every member, handed out or not, and stop the background work.

        Safe to call twice; finishes its removals even if the caller is cancelled.
        """
        if self._closed:
            await self._drain_closing()
            return
        self._closed = True
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(SandboxClosedError("the pool was closed while waiting"))
        self._waiters.clear()
        tasks = [t for t in (self._health_task, *self._creating) if t is not None]
        for task in tasks:
            task.cancel()
        members = [i.sandbox for i in self._idle] + list(self._in_use.values())
        self._idle.clear()
        self._in_use.clear()
        for sandbox in members:
            self._destroy(sandbox)
        # A creation that is cancelled removes its own container (AsyncSandbox.create).
        closing = asyncio.gather(*tasks, *self._closing, return_exceptions=True)
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            await asyncio.shield(closing)  # cancelled again: still finish removing
            raise

    async def _drain_closing(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def stats(self) -> PoolStats:
        """How many members are ready, handed out, starting and being removed."""
        return PoolStats(
            idle=len(self._idle),
            in_use=len(self._in_use),
            creating=len(self._creating),
            closing=len(self._closing),
            **self._counts,
            waiting=sum(1 for w in self._waiters if not w.done()),
        )

    # -- borrowing ---------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> _Acquisition:
        """A ready sandbox: ``sb = await pool.acquire()`` or ``async with pool.acquire() as sb``.

        With ``async with`` the sandbox is released when the block ends.  ``timeout``
        bounds the wait when no member is ready (``TimeoutError``); by default it waits
        as long as it takes to start one.
        """
        return _Acquisition(self, timeout)

    async def _acquire(self, timeout: float | None) -> AsyncSandbox:
        if self._closed:
            raise SandboxClosedError("the pool is closed; create a new one")
        if not self._started:
            await self.start()
        while self._idle:
            member = self._idle.popleft().sandbox
            self._in_use[member.id] = member  # counts as demand while it is checked
            if not self.check_on_acquire or await self._healthy(member):
                if self._closed:  # closed while we checked: close() removed it
                    raise SandboxClosedError("the pool was closed while acquiring")
                self._fill()
                return member
            del self._in_use[member.id]
            self._counts["replaced_dead"] += 1
            self._destroy(member)
        waiter: asyncio.Future[AsyncSandbox] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._fill()
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back_unused(waiter.result())  # handed over as we were cancelled
            elif not waiter.done():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    async def release(self, sandbox: AsyncSandbox) -> None:
        """Give a sandbox back: it is destroyed and replaced by a fresh one in the background.

        Releasing twice, or releasing a sandbox the borrower closed, is fine.
        """
        if self._in_use.pop(sandbox.id, None) is None:
            if sandbox.config.labels.get(POOL_LABEL) != self.id:
                raise SandboxError(f"sandbox {sandbox.id} does not belong to pool {self.id}")
            return  # released already, or the pool was closed (which removed it)
        self._counts["destroyed_after_use"] += 1
        sandbox.retire("was released to its pool and is being removed; acquire a new one")
        self._destroy(sandbox)
        self._fill()

    def _give_back_unused(self, sandbox: AsyncSandbox) -> None:
        """A member handed to a caller that never got it: still fresh, so it goes back."""
        self._in_use.pop(sandbox.id, None)
        if self._closed:
            self._destroy(sandbox)
        else:
            self._add_ready(sandbox)

    async def _healthy(self, sandbox: AsyncSandbox) -> bool:
        """The kernel answers (no engine call unless it is slow to)."""
        return await sandbox.ping(POOL_PING_SECONDS)

    # -- members -------------------------------------------------------------------

    async def _create_member(self) -> AsyncSandbox:
        async with self._create_slots:
            if self._closed:
                raise SandboxClosedError("the pool is closed")
            sandbox = await AsyncSandbox.create(self.config, host=self.host)
            try:
                await sandbox.warm_up()  # off the borrower's path
            except BaseException:
                await sandbox.close()
                raise
        self._counts["created"] += 1
        return sandbox

    def _add_ready(self, sandbox: AsyncSandbox) -> None:
        """Hand a fresh member to the oldest waiter, or keep it ready."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_use[sandbox.id] = sandbox
                waiter.set_result(sandbox)
                return
        self._idle.append(_Idle(sandbox, time.monotonic()))

    def _destroy(self, sandbox: AsyncSandbox) -> None:
        task = asyncio.get_running_loop().create_task(self._close_quietly(sandbox))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_quietly(sandbox: AsyncSandbox) -> None:
        try:
            await sandbox.close()
        except Exception:  # the atexit net and `kernel-sandbox gc` find what is left
            log.warning("could not remove pool member %s", sandbox.id, exc_info=True)

    def _fill(self) -> None:
        """Start members until the ready target is met (within ``max_size``)."""
        if self._closed or not self._started:
            return
        now = time.monotonic()
        waiting = sum(1 for w in self._waiters if not w.done())
        demand = len(self._in_use) + waiting
        if demand >= self._peak or now - self._peak_at > self.idle_timeout:
            self._peak, self._peak_at = demand, now
        ready_target = max(self.size, self._peak - demand)
        if self.on_empty == "create":
            wanted = ready_target + waiting
        else:
            wanted = max(ready_target, 1 if waiting else 0)
        total = len(self._idle) + len(self._in_use) + len(self._creating)
        missing = min(wanted - len(self._idle) - len(self._creating), self.max_size - total)
        if missing <= 0:
            return
        if now < self._retry_at:  # starting failed lately: try again after a pause
            if self._retry_handle is None:
                loop = asyncio.get_running_loop()
                self._retry_handle = loop.call_at(
                    loop.time() + self._retry_at - now, self._retry_fill
                )
            return
        for _ in range(missing):
            task = asyncio.get_running_loop().create_task(self._fill_one())
            self._creating.add(task)
            task.add_done_callback(self._creating.discard)

    def _retry_fill(self) -> None:
        self._retry_handle = None
        self._fill()

    async def _fill_one(self) -> None:
        try:
            sandbox = await self._create_member()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._creating.discard(asyncio.current_task())
            self._counts["create_failures"] += 1
            self._failures += 1
            self._retry_at = time.monotonic() + min(30.0, 0.5 * 2 ** (self._failures - 1))
            log.warning("the pool could not start a sandbox: %s", exc)
            self._fail_one_waiter(exc)
            return
        self._failures = 0
        # No longer "creating" from here on, not only once the task's callbacks ran.
        self._creating.discard(asyncio.current_task())
        if self._closed:
            self._destroy(sandbox)
            return
        self._add_ready(sandbox)
        asyncio.get_running_loop().call_soon(self._fill)

    def _fail_one_waiter(self, exc: Exception) -> None:
        """Tell a caller why no sandbox comes, rather than letting it wait for ever."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
                return

    # -- health ------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.health_interval)
            try:
                await self._check_idle()
            except asyncio.CancelledError:
                raise
            except Exception:  # engine hiccup: try again next round
                log.warning("pool health check failed", exc_info=True)
            self._reap()
            self._fill()

    async def _check_idle(self) -> None:
        """Replace idle members whose sandbox no longer runs (one engine call each)."""
        entries = list(self._idle)
        problems = await asyncio.gather(*(e.sandbox.health() for e in entries))
        for entry, problem in zip(entries, problems, strict=True):
            if problem is not None:
                with contextlib.suppress(ValueError):  # handed out meanwhile
                    self._idle.remove(entry)
                    self._counts["replaced_dead"] += 1
                    self._destroy(entry.sandbox)

    def _reap(self) -> None:
        """Remove ready members beyond the target once they were idle for ``idle_timeout``."""
        now = time.monotonic()
        demand = len(self._in_use) + sum(1 for w in self._waiters if not w.done())
        if now - self._peak_at > self.idle_timeout:
            self._peak, self._peak_at = demand, now
        target = max(self.size, self._peak - demand)
        extra = len(self._idle) - target
        for entry in sorted(self._idle, key=lambda e: e.since):
            if extra <= 0:
                break
            if now - entry.since >= self.idle_timeout:
                self._idle.remove(entry)
                self._counts["reaped"] += 1
                self._destroy(entry.sandbox)
                extra -= 1

    def __repr__(self) -> str:
        s = self.stats()
        state = "closed" if self._closed else "open"
        return (
            f"<SandboxPool {self.id} {state} idle={s.idle} in_use={s.in_use} "
            f"creating={s.creating} size={self.size} max_size={self.max_size}>"
        )


class _Acquisition:
    """What :meth:`SandboxPool.acquire` returns: awaitable, or an ``async with`` block."""

    def __init__(self, pool: SandboxPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._pool._acquire(self._timeout).__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._pool._acquire(self._timeout)
        return self._sandbox

    async def __aexit__(self, *exc_info: object) -> None:
        if self._sandbox is not None:
            await self._pool.release(self._sandbox)
