"""Exact snapshots of real gVisor sandboxes: the whole memory by the runtime's checkpoint.

What no portable snapshot can carry comes back — a running thread, an open file, a
half-used generator, a socket — in the sandbox that goes on after the snapshot, in a
restore, a fork and a resume under the same id; a changed blob, an oversized
checkpoint and another owner's snapshot are refused, and nothing of them runs.
Needs the engine's runsc runtime and its checkpoint API (an experimental daemon:
``scripts/setup-tiers.sh`` starts one), and root to move checkpoints.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from kernel_sandbox import AsyncSandbox, ConfigError, LocalSnapshotStore, SnapshotError
from kernel_sandbox.config import LABEL_PREFIX
from kernel_sandbox.errors import SnapshotNotFoundError
from tests.conftest import require
from tests.integration.conftest import PYTHON_IMAGE, TEST_LABEL

#: ``alone``: under other tests' load (pytest-xdist workers beside), a restore from a
#: checkpoint failed now and then (the restored container not running, or the bridge's
#: exec exit 126): make test runs these in one process after the others.
pytestmark = [pytest.mark.integration, pytest.mark.alone]

#: What only the whole memory holds: a thread that counts, an open file, a generator
#: half used, a socket pair, and the working directory, $HOME and /tmp in memory.
SESSION = r"""
import os, socket, threading, time
count = [0]
def tick():
    while True:
        count[0] += 1
        time.sleep(0.02)
ticker = threading.Thread(target=tick, daemon=True)
ticker.start()
log = open("log.txt", "w")
log.write("before;")
log.flush()
squares = (i * i for i in range(10))
next(squares), next(squares)
left, right = socket.socketpair()
left.sendall(b"queued")
open(os.path.expanduser("~/home.txt"), "w").write("home")
open("/tmp/tmp.txt", "w").write("tmp")
x = 21
"""

#: Checked in a sandbox that has the session's state, wherever it came from.
CHECK = r"""
import os, time
before = count[0]
time.sleep(0.3)
log.write("after")
log.flush()
print(
    x * 2,
    next(squares),
    ticker.is_alive() and count[0] > before,
    right.recv(6).decode(),
    open("log.txt").read(),
    open(os.path.expanduser("~/home.txt")).read(),
    open("/tmp/tmp.txt").read(),
)
"""
EXPECTED = "42 4 True queued before;after home tmp"


@pytest.fixture(scope="module")
def exact_engine(docker_engine):  # type: ignore[no-untyped-def]
    info = docker_engine.api.info()
    require("runsc" in (info.get("Runtimes") or {}), "the engine has no runsc runtime")
    require(
        bool(info.get("ExperimentalBuild")),
        "the engine does not allow checkpoints (start dockerd with experimental: true; "
        "scripts/setup-tiers.sh does)",
    )
    require(os.geteuid() == 0, "exact snapshots need root (the engine's checkpoint folder)")
    return docker_engine


@pytest.fixture
def store(tmp_path: Path) -> LocalSnapshotStore:
    return LocalSnapshotStore(tmp_path / "snapshots")


@pytest.fixture
async def exact_sandbox(exact_engine, make_sandbox):  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image=PYTHON_IMAGE, runtime="runsc", exact_snapshots=True)
    ran = await sandbox.run_python(SESSION)
    assert ran.status == "ok", ran.text
    return sandbox


def _containers(engine, sandbox_id: str) -> list[object]:  # type: ignore[no-untyped-def]
    return engine.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.id={sandbox_id}"})


async def test_the_whole_memory_comes_back_and_the_sandbox_runs_on(exact_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    snap = await exact_sandbox.snapshot(store=store)
    assert snap.exact and snap.sizes["bytes"] >= snap.sizes["memory_bytes"] > 1 << 20
    # the source went on where it was: its generator continues, its thread counts
    going_on = await exact_sandbox.run_python(CHECK)
    assert going_on.stdout.strip() == EXPECTED, going_on.text
    restored = await AsyncSandbox.restore(snap, store=store, labels=TEST_LABEL)
    try:
        # the state as it was at the snapshot: the generator where it was then, the
        # log without the source's later "after"
        back = await restored.run_python(CHECK)
        assert back.stdout.strip() == EXPECTED, back.text
        await restored.run_python("x = 100")
        assert (await exact_sandbox.run_python("print(x)")).stdout.strip() == "21"
    finally:
        await restored.close()


async def test_pause_frees_the_container_and_resume_keeps_id_and_memory(  # type: ignore[no-untyped-def]
    exact_sandbox, store, exact_engine
) -> None:
    sandbox_id = exact_sandbox.id
    snap = await exact_sandbox.pause(store=store)
    assert snap.exact and snap.paused == sandbox_id
    assert _containers(exact_engine, sandbox_id) == []  # its memory is freed
    resumed = await AsyncSandbox.resume(sandbox_id, store=store, labels=TEST_LABEL)
    try:
        assert resumed.id == sandbox_id
        back = await resumed.run_python(CHECK)
        assert back.stdout.strip() == EXPECTED, back.text
        with pytest.raises(SnapshotNotFoundError):  # the pause state was used up
            await store.paused(sandbox_id)
    finally:
        await resumed.close()


async def test_forks_are_independent_and_each_has_the_threads(exact_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    forks = await exact_sandbox.fork(2, store=store)
    try:
        await forks[0].run_python("x = 1")
        await forks[1].run_python("x = 2")
        seen = [(await f.run_python("print(x, ticker.is_alive())")).stdout.strip() for f in forks]
        assert seen == ["1 True", "2 True"]
        assert (await exact_sandbox.run_python("print(x)")).stdout.strip() == "21"
    finally:
        for fork in forks:
            await fork.close()


async def test_a_changed_blob_is_refused_and_its_container_removed(  # type: ignore[no-untyped-def]
    exact_sandbox, store, exact_engine
) -> None:
    snap = await exact_sandbox.snapshot(store=store)
    blob = store.root / snap.id / "state"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the sandbox's memory, changed on disk
    blob.write_bytes(bytes(data))
    run = uuid.uuid4().hex[:12]  # labels what this restore makes
    labels = {**TEST_LABEL, "kernel-sandbox.test-run": run}
    with pytest.raises(SnapshotError, match="does not match its digest"):
        await AsyncSandbox.restore(snap, store=store, labels=labels)
    # the half-made sandbox was removed, nothing was started (by label: tests in other
    # processes make containers meanwhile)
    made = f"kernel-sandbox.test-run={run}"
    assert not exact_engine.containers.list(all=True, filters={"label": made})  # type: ignore[attr-defined]


async def test_a_checkpoint_past_the_cap_is_refused_and_the_sandbox_runs_on(  # type: ignore[no-untyped-def]
    exact_sandbox, store
) -> None:
    with pytest.raises(SnapshotError, match="larger than 1,048,576"):
        await exact_sandbox.snapshot(store=store, max_bytes=1 << 20)
    assert await store.list() == []
    going_on = await exact_sandbox.run_python(CHECK)
    assert going_on.stdout.strip() == EXPECTED, going_on.text


async def test_another_owners_snapshot_is_not_restored(exact_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    snap = await exact_sandbox.snapshot(store=store.scoped("key-a"))
    with pytest.raises(SnapshotNotFoundError):
        await AsyncSandbox.restore(snap.id, store=store.scoped("key-b"), labels=TEST_LABEL)


async def test_exact_is_refused_where_it_cannot_be_had(exact_engine, make_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    plain = await make_sandbox(image=PYTHON_IMAGE, runtime="runsc")
    with pytest.raises(SnapshotError, match="not made ready for exact snapshots"):
        await plain.snapshot(exact=True, store=store)
    portable = await plain.snapshot(store=store)  # exact=None: what the sandbox can have
    assert not portable.exact
    with pytest.raises(ConfigError, match="need gVisor"):
        await make_sandbox(image=PYTHON_IMAGE, runtime="runc", exact_snapshots=True)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="contexts are not available"):
        exact = await make_sandbox(image=PYTHON_IMAGE, runtime="runsc", exact_snapshots=True)
        await exact.create_context(language="python")
    assert time.monotonic() - started < 60
