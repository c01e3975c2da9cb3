"""SandboxPool logic without an engine: members are fakes that start when told to."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from kernel_sandbox import pool as pool_module
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError, SandboxClosedError, SandboxError
from kernel_sandbox.pool import POOL_LABEL, SandboxPool

_ids = itertools.count()


class FakeSession:
    def __init__(self, member: FakeSandbox) -> None:
        self.member = member

    async def ping(self, timeout: float) -> bool:
        return self.member.alive

    async def warm_up(self) -> None:
        self.member.warmed = True


class FakeSandbox:
    """Just what the pool touches: id, config, container_id, liveness, close."""

    def __init__(self, config: SandboxConfig) -> None:
        self.id = f"fake{next(_ids)}"
        self.config = config
        self.container_id = f"c-{self.id}"
        self.alive = True
        self.warmed = False
        self.closed = False
        self.retired = ""
        self._session: FakeSession | None = FakeSession(self)

    async def _check_alive(self) -> str | None:
        return None if self.alive else "killed"

    async def close(self) -> None:
        self.closed = True

    def _retire(self, why: str) -> None:
        self.retired = why


class FakeBackend:
    def __init__(self) -> None:
        self.members: list[FakeSandbox] = []

    async def list(self, labels: dict[str, str]) -> list[dict[str, object]]:
        return [
            {"id": m.container_id, "state": "running" if m.alive else "exited"}
            for m in self.members
            if not m.closed
        ]


class Factory:
    """Replaces AsyncSandbox.create; ``gate`` holds creations until the test opens it."""

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: Exception | None = None
        self.started = 0

    async def create(self, config: SandboxConfig, **_: Any) -> FakeSandbox:
        self.started += 1
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        member = FakeSandbox(config)
        self.backend.members.append(member)
        return member


@pytest.fixture
def factory(monkeypatch: pytest.MonkeyPatch) -> Factory:
    backend = FakeBackend()
    made = Factory(backend)
    monkeypatch.setattr(pool_module.AsyncSandbox, "create", made.create)
    return made


def make_pool(factory: Factory, **kwargs: Any) -> SandboxPool:
    kwargs.setdefault("health_interval", 3600)
    return SandboxPool(backend=factory.backend, **kwargs)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def live(factory: Factory) -> list[FakeSandbox]:
    return [m for m in factory.backend.members if not m.closed]


@pytest.mark.parametrize(
    "kwargs",
    [{"size": -1}, {"size": 4, "max_size": 2}, {"on_empty": "fail"}, {"idle_timeout": 0}],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SandboxPool(backend=FakeBackend(), **kwargs)  # type: ignore[arg-type]


def test_members_carry_the_pool_label_and_the_overrides() -> None:
    pool = SandboxPool(backend=FakeBackend(), image="x:y", labels={"a": "b"})  # type: ignore[arg-type]
    assert pool.config.image == "x:y"
    assert pool.config.labels == {"a": "b", POOL_LABEL: pool.id}
    assert "KERNEL_SANDBOX_PREIMPORT" not in pool.config.env_vars


def test_preimport_reaches_the_members_environment() -> None:
    pool = SandboxPool(
        backend=FakeBackend(),  # type: ignore[arg-type]
        env_vars={"A": "1"},
        preimport=("numpy", "pandas"),
    )
    assert pool.config.env_vars == {"A": "1", "KERNEL_SANDBOX_PREIMPORT": "numpy,pandas"}


async def test_start_fills_to_size_and_acquire_hands_out_a_ready_member(factory: Factory) -> None:
    async with make_pool(factory, size=3) as pool:
        assert pool.stats().idle == 3
        sandbox = await pool.acquire()
        assert sandbox in factory.backend.members and not sandbox.closed and sandbox.warmed
        await settle()
        assert pool.stats().in_use == 1 and pool.stats().idle == 3  # refilled


async def test_release_destroys_the_member_and_never_hands_it_out_again(factory: Factory) -> None:
    async with make_pool(factory, size=1) as pool:
        seen = set()
        for _ in range(5):
            async with pool.acquire() as sandbox:
                assert sandbox.id not in seen
                seen.add(sandbox.id)
            await settle()
            assert sandbox.closed
        assert pool.stats().destroyed_after_use == 5


async def test_release_twice_is_fine_but_a_foreign_sandbox_is_refused(factory: Factory) -> None:
    async with make_pool(factory, size=1) as pool:
        sandbox = await pool.acquire()
        await pool.release(sandbox)
        # refused at once, before the pool's background close reaches it
        assert "released to its pool" in sandbox.retired  # type: ignore[attr-defined]
        await pool.release(sandbox)
        with pytest.raises(SandboxError, match="does not belong"):
            await pool.release(FakeSandbox(SandboxConfig()))  # type: ignore[arg-type]


async def test_empty_pool_creates_for_the_caller(factory: Factory) -> None:
    async with make_pool(factory, size=0, on_empty="create") as pool:
        assert pool.stats().idle == 0
        sandbox = await pool.acquire()
        assert not sandbox.closed and pool.stats().in_use == 1


async def test_wait_mode_at_the_cap_waits_for_a_release(factory: Factory) -> None:
    async with make_pool(factory, size=1, max_size=1, on_empty="wait") as pool:
        first = await pool.acquire()
        second = asyncio.ensure_future(pool.acquire())
        await settle()
        assert not second.done() and pool.stats().total == 1  # the cap holds
        await pool.release(first)
        got = await asyncio.wait_for(second, 5)
        assert got.id != first.id and first.closed


async def test_acquire_timeout_raises_timeout_error(factory: Factory) -> None:
    async with make_pool(factory, size=1, max_size=1) as pool:
        await pool.acquire()
        with pytest.raises(TimeoutError):
            await pool.acquire(timeout=0.05)
        assert pool.stats().total == 1


async def test_a_dead_idle_member_is_skipped_and_replaced(factory: Factory) -> None:
    async with make_pool(factory, size=2) as pool:
        dead = [m for m in factory.backend.members]
        for m in dead:
            m.alive = False
        sandbox = await pool.acquire()
        assert sandbox not in dead and sandbox.alive
        await settle()
        assert all(m.closed for m in dead)
        assert pool.stats().replaced_dead == 2


async def test_the_health_check_replaces_dead_idle_members(factory: Factory) -> None:
    async with make_pool(factory, size=2, health_interval=0.01) as pool:
        victim = factory.backend.members[0]
        victim.alive = False
        for _ in range(200):
            await asyncio.sleep(0.01)
            if victim.closed and pool.stats().idle == 2:
                break
        assert victim.closed and pool.stats().replaced_dead == 1
        assert len(live(factory)) == 2


async def test_the_cap_bounds_members_in_total(factory: Factory) -> None:
    async with make_pool(factory, size=1, max_size=3) as pool:
        factory.gate.clear()
        waiting = [asyncio.ensure_future(pool.acquire()) for _ in range(6)]
        await settle()
        assert pool.stats().total == 3
        factory.gate.set()
        await settle()
        assert sum(w.done() for w in waiting) == 3
        for w in waiting:
            if w.done():
                await pool.release(w.result())
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert pool.stats().total <= 3


async def test_extras_after_a_burst_are_reaped_back_to_size(factory: Factory) -> None:
    async with make_pool(factory, size=1, idle_timeout=0.5, health_interval=0.01) as pool:
        burst = [await pool.acquire() for _ in range(3)]
        for sandbox in burst:
            await pool.release(sandbox)
        await settle()
        assert pool.stats().idle == 3  # warm for the next burst of the same size
        for _ in range(300):
            await asyncio.sleep(0.01)
            if pool.stats().idle == 1:
                break
        assert pool.stats().idle == 1 and pool.stats().reaped == 2
        await settle()
        assert len(live(factory)) == 1


async def test_a_failing_start_reaches_the_waiting_caller(factory: Factory) -> None:
    async with make_pool(factory, size=0) as pool:
        factory.fail_with = SandboxError("no such image")
        with pytest.raises(SandboxError, match="no such image"):
            await pool.acquire()


async def test_start_raises_when_no_member_can_start(factory: Factory) -> None:
    factory.fail_with = SandboxError("engine down")
    pool = make_pool(factory, size=2)
    with pytest.raises(SandboxError, match="engine down"):
        await pool.start()
    assert pool.closed


async def test_a_cancelled_waiter_gives_its_member_back(factory: Factory) -> None:
    async with make_pool(factory, size=0) as pool:
        factory.gate.clear()
        waiter = asyncio.ensure_future(pool.acquire())
        await settle()
        waiter.cancel()
        factory.gate.set()
        await settle()
        assert waiter.cancelled()
        assert pool.stats().in_use == 0 and pool.stats().idle == 1  # fresh, so kept


async def test_close_removes_every_member_and_wakes_waiters(factory: Factory) -> None:
    pool = await make_pool(factory, size=2, max_size=3).start()
    held = await pool.acquire()
    factory.gate.clear()
    await pool.acquire()  # uses the last idle one
    waiter = asyncio.ensure_future(pool.acquire())
    await settle()
    await pool.close()
    with pytest.raises(SandboxClosedError):
        await waiter
    assert held.closed and not live(factory)
    with pytest.raises(SandboxClosedError):
        await pool.acquire()
