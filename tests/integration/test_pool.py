"""SandboxPool against a real engine: isolation between borrowers, health, shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import docker.errors
import pytest

from kernel_sandbox.pool import POOL_LABEL, SandboxPool
from tests.conftest import TEST_LABEL
from tests.integration.conftest import PYTHON_IMAGE
from tests.waiting import await_for

pytestmark = pytest.mark.integration

LEAVE_STATE = "secret = 42\nimport subprocess\nsubprocess.Popen(['sleep', '900'])"
COUNT_SLEEPERS = (  # processes whose program is `sleep`
    "import os\n"
    "argv0 = [open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')[0]\n"
    "         for p in os.listdir('/proc') if p.isdigit()]\n"
    "print(sum(os.path.basename(a) == b'sleep' for a in argv0))"
)


def make_pool(**kwargs: Any) -> SandboxPool:
    return SandboxPool(image=PYTHON_IMAGE, labels=dict(TEST_LABEL), **kwargs)


def containers(client: Any, pool: SandboxPool, *, running_only: bool = False) -> list[Any]:
    """The pool's containers, as the engine lists them (sparse: docker-py's full list
    inspects each one after listing, and a container the pool removes in between made
    that a 404; seen once in a full run)."""
    return client.containers.list(  # type: ignore[no-any-return]
        all=not running_only, filters={"label": f"{POOL_LABEL}={pool.id}"}, sparse=True
    )


def gone(client: Any, container_id: str) -> bool:
    try:
        client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return True
    return False


async def test_a_borrower_never_sees_the_previous_borrowers_state(docker_engine: Any) -> None:
    async with make_pool(size=1) as pool:
        async with pool.acquire() as first:
            ex = await first.run_python(LEAVE_STATE)
            assert ex.execution_count == 1  # the pool's warm-up cell left no trace
            await first.files.write("secret.txt", "42")
            await first.run_shell("nohup sleep 901 >/dev/null 2>&1 &")
            assert (await first.run_python("secret")).text == "42"
            assert await first.files.exists("secret.txt")
            assert (await first.run_python(COUNT_SLEEPERS)).text.strip() == "2"
        async with pool.acquire() as second:
            assert second.id != first.id and second.container_id != first.container_id
            fresh = await second.run_python("'secret' in globals(), len(In)")
            assert fresh.text == "(False, 2)" and fresh.execution_count == 1
            assert not await second.files.exists("secret.txt")
            assert (await second.run_python(COUNT_SLEEPERS)).text.strip() == "0"
        assert first.closed
        await await_for(
            lambda: gone(docker_engine, first.container_id), 120, what="the used container"
        )


async def test_a_dead_idle_member_is_never_handed_out(docker_engine: Any) -> None:
    async with make_pool(size=2, health_interval=3600) as pool:
        killed = {c.id for c in containers(docker_engine, pool)}
        assert len(killed) == 2
        for container_id in killed:
            docker_engine.api.kill(container_id)
        async with pool.acquire() as sandbox:
            assert sandbox.container_id not in killed
            assert (await sandbox.run_python("1 + 1")).text == "2"
        assert pool.stats().replaced_dead == 2
        await await_for(
            lambda: all(gone(docker_engine, c) for c in killed), 120, what="the dead containers"
        )


async def test_the_health_check_replaces_a_dead_idle_member(docker_engine: Any) -> None:
    async with make_pool(size=2, health_interval=0.2) as pool:
        victim = containers(docker_engine, pool)[0].id
        docker_engine.api.kill(victim)

        def replaced() -> bool:
            s = pool.stats()
            running = containers(docker_engine, pool, running_only=True)
            return s.replaced_dead == 1 and s.idle == 2 and len(running) == 2

        await await_for(replaced, 120, what="the dead member to be replaced")
        assert gone(docker_engine, victim) or victim not in {
            c.id for c in containers(docker_engine, pool, running_only=True)
        }
        async with pool.acquire() as sandbox:
            assert (await sandbox.run_python("1 + 1")).text == "2"


async def test_close_removes_every_container_also_handed_out_ones(docker_engine: Any) -> None:
    pool = await make_pool(size=2).start()
    held = await pool.acquire()
    assert (await held.run_python("1")).status == "ok"
    assert len(containers(docker_engine, pool)) >= 2
    await pool.close()
    assert held.closed
    assert containers(docker_engine, pool) == []


async def test_cancelling_the_pool_owner_leaves_no_container(docker_engine: Any) -> None:
    for phase in ("while starting", "while in use"):
        pool = make_pool(size=2)
        busy = asyncio.Event()

        async def owner(pool: SandboxPool = pool, busy: asyncio.Event = busy) -> None:
            async with pool, pool.acquire() as sandbox:
                busy.set()
                await sandbox.run_python("import time; time.sleep(120)", timeout=300)

        task = asyncio.create_task(owner())
        if phase == "while starting":
            await await_for(
                lambda pool=pool: bool(containers(docker_engine, pool)),
                120,
                what="a first container",
            )
        else:
            await asyncio.wait_for(busy.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert containers(docker_engine, pool) == [], phase


async def test_an_empty_pool_creates_for_the_caller(docker_engine: Any) -> None:
    async with make_pool(size=0, on_empty="create", preimport=("json",)) as pool:
        assert containers(docker_engine, pool) == []
        async with pool.acquire() as sandbox:
            assert (await sandbox.run_python("1 + 1")).text == "2"
            assert (await sandbox.run_python("'json' in dir()")).text == "True"  # preimported


async def test_an_empty_pool_in_wait_mode_waits_for_a_fresh_member(docker_engine: Any) -> None:
    async with make_pool(size=1, max_size=1, on_empty="wait") as pool:
        first = await pool.acquire()
        await first.run_python("left = 'behind'")
        second = asyncio.ensure_future(pool.acquire())
        for _ in range(50):
            await asyncio.sleep(0)
        assert not second.done()
        assert len(containers(docker_engine, pool)) == 1  # the cap holds while waiting
        await pool.release(first)
        got = await asyncio.wait_for(second, 120)
        assert got.id != first.id
        assert (await got.run_python("'left' in globals()")).text == "False"
        await pool.release(got)


async def test_idle_extras_are_reaped_back_to_size(docker_engine: Any) -> None:
    async with make_pool(size=1, max_size=3, idle_timeout=3, health_interval=0.2) as pool:
        burst = await asyncio.gather(*(pool.acquire() for _ in range(3)))
        assert len({s.id for s in burst}) == 3
        for sandbox in burst:
            await pool.release(sandbox)

        def back_to_size() -> bool:
            s = pool.stats()
            return s.reaped >= 1 and s.idle == 1 and s.creating == 0 and s.closing == 0

        await await_for(back_to_size, 120, what="the pool to shrink back to its size")
        assert len(containers(docker_engine, pool)) == 1
