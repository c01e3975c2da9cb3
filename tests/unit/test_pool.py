"""SandboxPool without an engine: its members are real sandboxes on LocalKernelHost.

The host below is LocalKernelHost with a gate in front of its launch, so a test can
hold creations back or make them fail; everything else (sandboxes, pings, health
checks, close) is the real code.  Waits are for conditions, with deadlines.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError, SandboxClosedError, SandboxError
from kernel_sandbox.kernel.connection import ConnectionInfo
from kernel_sandbox.limits import POOL_PING_SECONDS
from kernel_sandbox.pool import POOL_LABEL, SandboxPool
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.testing import LocalKernelHost
from tests.waiting import await_for


class Gate:
    """What the test controls about member creation, and the hosts made so far."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.fail_with: Exception | None = None
        self.started = 0
        self.hosts: list[GatedHost] = []

    def live(self) -> list[GatedHost]:
        """Hosts whose kernel was launched and not cleaned up."""
        return [h for h in self.hosts if h.launched and not h.cleaned]


class GatedHost(LocalKernelHost):
    """LocalKernelHost whose launch waits for the test's gate (and fails when told)."""

    def __init__(self, sandbox_id: str, config: SandboxConfig, *, gate: Gate) -> None:
        super().__init__(sandbox_id, config)
        self.gate = gate
        self.launched = self.cleaned = False
        gate.hosts.append(self)

    async def launch(self) -> ConnectionInfo:
        self.gate.started += 1
        await self.gate.open.wait()
        if self.gate.fail_with is not None:
            raise self.gate.fail_with
        info = await super().launch()
        self.launched = True
        return info

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart)
        self.cleaned = self.cleaned or not restart


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def pools(gate: Gate) -> AsyncIterator[Callable[..., SandboxPool]]:
    made: list[SandboxPool] = []

    def make(**kwargs: Any) -> SandboxPool:
        kwargs.setdefault("health_interval", 3600)
        pool = SandboxPool(host=functools.partial(GatedHost, gate=gate), **kwargs)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        await pool.close()


@pytest.mark.parametrize(
    "kwargs",
    [{"size": -1}, {"size": 4, "max_size": 2}, {"on_empty": "fail"}, {"idle_timeout": 0}],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SandboxPool(host="local", **kwargs)


def test_members_carry_the_pool_label_and_the_overrides() -> None:
    pool = SandboxPool(host="local", image="x:y", labels={"a": "b"})
    assert pool.config.image == "x:y"
    assert pool.config.labels == {"a": "b", POOL_LABEL: pool.id}
    assert "KERNEL_SANDBOX_PREIMPORT" not in pool.config.env_vars


def test_preimport_reaches_the_members_environment() -> None:
    pool = SandboxPool(host="local", env_vars={"A": "1"}, preimport=("numpy", "pandas"))
    assert pool.config.env_vars == {"A": "1", "KERNEL_SANDBOX_PREIMPORT": "numpy,pandas"}


async def test_start_fills_to_size_and_acquire_hands_out_a_ready_member(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=2) as pool:
        assert pool.stats().idle == 2
        sandbox = await pool.acquire()
        assert sandbox.host in gate.live() and not sandbox.closed
        assert (await sandbox.run_python("print(6 * 7)")).text == "42"
        await await_for(lambda: pool.stats().idle == 2, 60, 0.02, "the refill")
        assert pool.stats().in_use == 1


async def test_release_destroys_the_member_and_never_hands_it_out_again(
    pools: Callable[..., SandboxPool],
) -> None:
    async with pools(size=1) as pool:
        seen = set()
        for _ in range(3):
            async with pool.acquire() as sandbox:
                assert sandbox.id not in seen
                seen.add(sandbox.id)
            await await_for(lambda s=sandbox: s.host.cleaned, 60, 0.02, "the used member to go")
            assert sandbox.closed
        assert pool.stats().destroyed_after_use == 3


async def test_release_twice_is_fine_but_a_foreign_sandbox_is_refused(
    pools: Callable[..., SandboxPool], idle_sandbox: AsyncSandbox
) -> None:
    async with pools(size=1) as pool:
        sandbox = await pool.acquire()
        await pool.release(sandbox)
        # refused at once, before the pool's background close reaches it
        with pytest.raises(SandboxClosedError, match="released to its pool"):
            await sandbox.run_python("1")
        await pool.release(sandbox)
        with pytest.raises(SandboxError, match="does not belong"):
            await pool.release(idle_sandbox)


async def test_empty_pool_creates_for_the_caller(pools: Callable[..., SandboxPool]) -> None:
    async with pools(size=0, on_empty="create") as pool:
        assert pool.stats().idle == 0
        sandbox = await pool.acquire()
        assert not sandbox.closed and pool.stats().in_use == 1


async def test_wait_mode_at_the_cap_waits_for_a_release(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=1, max_size=1, on_empty="wait") as pool:
        first = await pool.acquire()
        second = asyncio.ensure_future(pool.acquire())
        await await_for(lambda: pool.stats().waiting == 1, 60, 0.02, "the second caller to wait")
        assert not second.done() and pool.stats().total == 1 and gate.started == 1
        await pool.release(first)
        got = await asyncio.wait_for(second, 60)
        assert got.id != first.id and first.closed


async def test_acquire_timeout_raises_timeout_error(pools: Callable[..., SandboxPool]) -> None:
    async with pools(size=1, max_size=1) as pool:
        await pool.acquire()
        with pytest.raises(TimeoutError):
            await pool.acquire(timeout=0.05)
        assert pool.stats().total == 1


async def test_a_dead_idle_member_is_skipped_and_replaced(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=2) as pool:
        dead = list(gate.live())
        for host in dead:
            await host.kill()
        sandbox = await pool.acquire()
        assert sandbox.host not in dead
        assert (await sandbox.run_python("1 + 1")).status == "ok"
        await await_for(lambda: all(h.cleaned for h in dead), 60, 0.02, "the dead members to go")
        assert pool.stats().replaced_dead == 2


async def test_a_member_that_does_not_answer_is_discarded_at_the_ping_limit(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=1) as pool:
        (frozen,) = gate.live()
        await frozen.send_signal(signal.SIGSTOP)  # alive, but its kernel never answers
        sandbox = await asyncio.wait_for(pool.acquire(), POOL_PING_SECONDS + 60)
        assert sandbox.host is not frozen
        assert (await sandbox.run_python("1 + 1")).status == "ok"
        assert pool.stats().replaced_dead == 1


async def test_the_health_check_replaces_dead_idle_members(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=2, health_interval=0.05) as pool:
        victim = gate.live()[0]
        await victim.kill()
        await await_for(
            lambda: victim.cleaned and pool.stats().idle == 2, 60, 0.02, "the replacement"
        )
        assert pool.stats().replaced_dead == 1
        assert len(gate.live()) == 2


async def test_the_cap_bounds_members_in_total(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=1, max_size=3) as pool:
        gate.open.clear()
        waiting = [asyncio.ensure_future(pool.acquire()) for _ in range(5)]
        await await_for(lambda: gate.started == 3, 60, 0.02, "creations up to the cap")
        assert pool.stats().total == 3
        gate.open.set()
        await await_for(
            lambda: sum(w.done() for w in waiting) == 3, 60, 0.02, "three members handed out"
        )
        for w in waiting:
            if w.done():
                await pool.release(w.result())
        await asyncio.wait_for(asyncio.gather(*waiting), 120)
        assert pool.stats().total <= 3 and gate.started <= 3 + 5


async def test_extras_after_a_burst_are_reaped_back_to_size(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=1, idle_timeout=0.5, health_interval=0.05) as pool:
        burst = [await pool.acquire() for _ in range(3)]
        for sandbox in burst:
            await pool.release(sandbox)
        await await_for(lambda: pool.stats().reaped == 2, 120, 0.02, "the extras to be reaped")
        await await_for(
            lambda: pool.stats().idle == 1 and len(gate.live()) == 1, 60, 0.02, "size 1 again"
        )


async def test_a_failing_start_reaches_the_waiting_caller(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=0) as pool:
        gate.fail_with = SandboxError("no such image")
        with pytest.raises(SandboxError, match="no such image"):
            await pool.acquire()


async def test_start_raises_when_no_member_can_start(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    gate.fail_with = SandboxError("engine down")
    pool = pools(size=2)
    with pytest.raises(SandboxError, match="engine down"):
        await pool.start()
    assert pool.closed


async def test_a_cancelled_waiter_gives_its_member_back(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    async with pools(size=0) as pool:
        gate.open.clear()
        waiter = asyncio.ensure_future(pool.acquire())
        await await_for(lambda: gate.started == 1, 60, 0.02, "the creation to start")
        waiter.cancel()
        gate.open.set()
        await await_for(lambda: pool.stats().idle == 1, 60, 0.02, "the member to be kept")
        assert waiter.cancelled()
        assert pool.stats().in_use == 0  # fresh, so kept


async def test_close_removes_every_member_and_wakes_waiters(
    pools: Callable[..., SandboxPool], gate: Gate
) -> None:
    pool = await pools(size=2, max_size=3).start()
    held = await pool.acquire()
    gate.open.clear()
    await pool.acquire()  # uses the last idle one
    waiter = asyncio.ensure_future(pool.acquire())
    await await_for(lambda: gate.started >= 3, 60, 0.02, "a creation to wait at the gate")
    await pool.close()
    with pytest.raises(SandboxClosedError):
        await waiter
    gate.open.set()
    await await_for(lambda: not gate.live(), 60, 0.02, "every member to be removed")
    assert held.closed
    with pytest.raises(SandboxClosedError):
        await pool.acquire()
