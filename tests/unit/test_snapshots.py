"""Portable snapshots on LocalKernelHost: the real sandbox, kernel program and store.

Round trips of what a session holds, unpicklables named, pause/resume under the same
id, independent forks, owners kept apart, a changed blob refused, and the host's caps
holding against a kernel that lies about what it writes.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_sandbox import (
    AsyncSandbox,
    LocalSnapshotStore,
    SandboxClosedError,
    SnapshotError,
    SnapshotNotFoundError,
)
from kernel_sandbox.snapshots.tarcount import TarCounter
from kernel_sandbox.testing import _live
from tests.unit.conftest import NewSandbox


@pytest.fixture
def store(tmp_path: Path) -> LocalSnapshotStore:
    return LocalSnapshotStore(tmp_path / "snapshots")


@pytest.fixture
async def made() -> AsyncIterator[list[AsyncSandbox]]:
    """Sandboxes a test restored or resumed (closed after it)."""
    sandboxes: list[AsyncSandbox] = []
    yield sandboxes
    for sandbox in sandboxes:
        await sandbox.close()


SESSION = """
import math
import threading, socket
import numpy as np
from collections import OrderedDict
numbers = [1, 2.5, 3j]
table = {"a": {1, 2}, "b": (None, "x")}
ordered = OrderedDict(z=1)
arr = np.arange(12, dtype=np.float32).reshape(3, 4)
big = np.ones(300_000)
offset = 10
def shifted(v):
    return v + offset
square = lambda v: v * v
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm(self):
        return math.hypot(self.x, self.y)
p = Point(3, 4)
handle = open("notes.txt", "w")
handle.write("kept")
handle.flush()
conn = socket.socket()
worker = threading.Thread(target=lambda: None)
counter = (i for i in range(3))
_private = 1
"""

CHECK = """
assert numbers == [1, 2.5, 3j] and table == {"a": {1, 2}, "b": (None, "x")}
assert list(ordered) == ["z"] and type(ordered).__name__ == "OrderedDict"
assert arr.dtype == np.float32 and arr.shape == (3, 4) and arr[2, 3] == 11
assert big.sum() == 300_000
assert shifted(1) == 11 and square(7) == 49
assert p.norm() == 5.0 and isinstance(p, Point)
assert math.pi > 3
print(open("notes.txt").read(), open("sub/deep.bin", "rb").read())
print(sorted(n for n in ("handle", "conn", "worker", "counter", "_private") if n in dir()))
"""


async def test_a_session_round_trips_and_unpicklables_are_named(
    new_sandbox: NewSandbox, store: LocalSnapshotStore, made: list[AsyncSandbox]
) -> None:
    sandbox = await new_sandbox()
    assert (await sandbox.run_python(SESSION)).status == "ok"
    await sandbox.files.write("sub/deep.bin", b"\x00\x01")
    count = (await sandbox.run_python("get_ipython().execution_count")).text

    snap = await sandbox.snapshot(name="first", store=store)

    assert snap.name == "first" and snap.sandbox_id == sandbox.id and not snap.exact
    assert set(snap.not_saved) == {"handle", "conn", "worker", "counter"}
    assert "open file" in snap.not_saved["handle"]
    assert "socket" in snap.not_saved["conn"] and "thread" in snap.not_saved["worker"]
    assert "generator" in snap.not_saved["counter"]
    assert {"numbers", "arr", "shifted", "square", "Point", "p"} <= set(snap.saved)
    assert snap.modules == {
        "math": "math",
        "threading": "threading",
        "socket": "socket",
        "np": "numpy",
    }
    assert snap.sizes["bytes"] > 2_400_000 and snap.sizes["entries"] >= 12
    # the snapshot ran no cell of the user's: its history and count are unchanged
    assert (await sandbox.run_python("get_ipython().execution_count")).text == str(int(count) + 1)

    restored = await AsyncSandbox.restore(snap.id, store=store)
    made.append(restored)
    assert restored.id != sandbox.id and restored.restored is not None
    assert restored.restored.failed == {}
    check = await restored.run_python(CHECK)
    assert check.status == "ok", check.text
    assert check.stdout.splitlines() == ["kept b'\\x00\\x01'", "[]"]


async def test_pause_frees_the_sandbox_and_resume_brings_it_back_under_its_id(
    new_sandbox: NewSandbox, store: LocalSnapshotStore, made: list[AsyncSandbox]
) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_python("state = {'step': 7}")
    kernel_pid = sandbox.container_id

    snap = await sandbox.pause(store=store)

    assert snap.paused == sandbox.id and sandbox.closed
    assert sandbox.id not in _live  # the kernel process is gone
    with pytest.raises(SandboxClosedError):
        await sandbox.run_python("1")
    resumed = await AsyncSandbox.resume(sandbox.id, store=store)
    made.append(resumed)
    assert resumed.id == sandbox.id and resumed.container_id != kernel_pid
    assert (await resumed.run_python("state['step']")).text == "7"
    with pytest.raises(SnapshotNotFoundError):  # consumed: one sandbox per id
        await AsyncSandbox.resume(sandbox.id, store=store)
    assert await store.list() == []


async def test_forks_are_independent(
    new_sandbox: NewSandbox, store: LocalSnapshotStore, made: list[AsyncSandbox]
) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_python("items = [0]")
    await sandbox.files.write("f.txt", "base")

    forks = await sandbox.fork(2, store=store)
    made.extend(forks)

    assert len({f.id for f in forks} | {sandbox.id}) == 3
    await forks[0].run_python("items.append(1)")
    await forks[0].files.write("f.txt", "changed")
    for other in (forks[1], sandbox):
        assert (await other.run_python("items")).text == "[0]"
        assert await other.files.read_text("f.txt") == "base"
    assert (await forks[0].run_python("items")).text == "[0, 1]"
    assert forks[0].restored is not None
    with pytest.raises(ValueError):
        await sandbox.fork(0, store=store)


async def test_another_owner_cannot_see_restore_or_delete_a_snapshot(
    new_sandbox: NewSandbox, store: LocalSnapshotStore
) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_python("secret = 42")
    alice, bob = store.scoped("alice"), store.scoped("bob")
    snap = await sandbox.snapshot(store=alice)

    assert snap.owner == "alice" and [s.id for s in await alice.list()] == [snap.id]
    assert await bob.list() == []
    for attempt in (bob.get(snap.id), bob.delete(snap.id), AsyncSandbox.restore(snap, store=bob)):
        with pytest.raises(SnapshotNotFoundError):
            await attempt
    with pytest.raises(SnapshotNotFoundError):  # an id is never a path
        await store.get("../../etc")
    assert (await store.get(snap.id)).owner == "alice"


async def test_a_changed_blob_is_refused_and_its_sandbox_removed(
    new_sandbox: NewSandbox, store: LocalSnapshotStore
) -> None:
    sandbox = await new_sandbox()
    await sandbox.files.write("a.txt", "x" * 5000)
    snap = await sandbox.snapshot(store=store)
    blob = store.root / snap.id / "state"
    data = bytearray(blob.read_bytes())
    data[600] ^= 1  # inside the file's data: still a valid tar, not the same bytes
    blob.write_bytes(bytes(data))
    before = set(_live)

    with pytest.raises(SnapshotError, match="digest"):
        await AsyncSandbox.restore(snap, store=store)

    assert set(_live) == before  # the half-restored sandbox was removed


async def test_caps_hold_against_a_kernel_that_lies(
    new_sandbox: NewSandbox, store: LocalSnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await new_sandbox()
    await sandbox.files.write("big.bin", b"\x00" * 300_000)
    with pytest.raises(SnapshotError, match="larger than 100,000 bytes"):
        await sandbox.snapshot(store=store, max_bytes=100_000)
    # code in the sandbox rewrites the snapshot program's tar: thousands of members
    flood = """
import tarfile, io
_real = tarfile.TarFile.addfile
def _flood(self, info, fileobj=None):
    for i in range(3000):
        _real(self, tarfile.TarInfo(f"work/x{i}"), io.BytesIO())
    return _real(self, info, fileobj)
tarfile.TarFile.addfile = _flood
"""
    assert (await sandbox.run_python(flood)).status == "ok"
    monkeypatch.setattr("kernel_sandbox.sandbox.MAX_SNAPSHOT_FILES", 1000)
    with pytest.raises(SnapshotError, match="more than 1,000 entries"):
        await sandbox.snapshot(store=store)
    # ... or writes what is no tar at all
    junk = "tarfile.TarFile.addfile = lambda self, *a: self.fileobj.write(b'\\x07' * 4096)"
    assert (await sandbox.run_python(junk)).status == "ok"
    with pytest.raises(SnapshotError, match="not a tar archive"):
        await sandbox.snapshot(store=store)
    assert await store.list() == []
    assert list(store.root.iterdir()) == []  # no partial blob is left behind


async def test_a_lying_report_is_cut_to_bounded_text_or_refused(
    new_sandbox: NewSandbox, store: LocalSnapshotStore
) -> None:
    sandbox = await new_sandbox()
    # code in the sandbox rewrites the snapshot program's report: long names and reasons
    lie = """
import json
_dumps = json.dumps
def _lying(obj, *args, **kwargs):
    if isinstance(obj, dict) and "saved" in obj:
        obj = {**obj, "not_saved": {"v" * 10_000: "r" * 10_000}, "errors": ["e" * 1000] * 500}
    return _dumps(obj, *args, **kwargs)
json.dumps = _lying
"""
    assert (await sandbox.run_python(lie)).status == "ok"
    snap = await sandbox.snapshot(store=store)
    assert [(len(k), len(v)) for k, v in snap.not_saved.items()] == [(300, 300)]
    assert len(snap.file_errors) == 100 and {len(e) for e in snap.file_errors} == {300}
    # ... or a report of 5 MB: the host keeps 4 MiB of the kernel's output and refuses it
    huge = "_big = 'x' * 5_000_000\njson.dumps = lambda obj, *a, **k: _dumps({**obj, 'pad': _big})"
    assert (await sandbox.run_python(huge)).status == "ok"
    with pytest.raises(SnapshotError, match=r"report of the save is (too large|not JSON)"):
        await sandbox.snapshot(store=store)


async def test_a_kernel_that_stalls_its_snapshot_is_ended_at_the_deadline(
    new_sandbox: NewSandbox, store: LocalSnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await new_sandbox()
    stall = "import tarfile, time\ntarfile.TarFile.addfile = lambda self, *a, **k: time.sleep(3600)"
    assert (await sandbox.run_python(stall)).status == "ok"
    monkeypatch.setattr("kernel_sandbox.snapshots.portable.SNAPSHOT_DEADLINE", 3.0)
    # 120 s scaled down (fast), and SNAPSHOT_RATE's grant for 4 MB: 0.2 s at 20 MB/s
    with pytest.raises(SnapshotError, match=r"did not finish: it ran past its 3\.2s"):
        await asyncio.wait_for(sandbox.snapshot(store=store, max_bytes=4_000_000), 60)
    assert await store.list() == []


async def test_the_host_never_unpickles(
    new_sandbox: NewSandbox,
    store: LocalSnapshotStore,
    made: list[AsyncSandbox],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the host unpickled something")

    import dill  # type: ignore[import-untyped]

    for target in (pickle, dill):
        for name in ("loads", "load", "Unpickler"):
            monkeypatch.setattr(target, name, refuse)
    sandbox = await new_sandbox()
    await sandbox.run_python("value = {'deep': [1, 2]}")
    restored = await AsyncSandbox.restore(await sandbox.snapshot(store=store), store=store)
    made.append(restored)
    assert (await restored.run_python("value")).text == "{'deep': [1, 2]}"


async def test_retention_keeps_the_newest_and_every_paused_sandbox(
    new_sandbox: NewSandbox, store: LocalSnapshotStore
) -> None:
    sandbox = await new_sandbox()
    first = await sandbox.snapshot(store=store)
    second = await sandbox.snapshot(store=store)
    other = await new_sandbox()
    paused = await other.pause(store=store)

    assert await store.prune(keep=1) == [first.id]
    assert {s.id for s in await store.list()} == {second.id, paused.id}
    assert await store.prune(older_than=0) == [second.id]
    await store.delete(paused.id)
    with pytest.raises(SnapshotNotFoundError):
        await store.delete(paused.id)


def test_the_tar_counter_counts_members_and_refuses_what_is_not_tar() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for i in range(5):
            data = b"y" * (i * 700)
            info = tarfile.TarInfo(f"work/{'long-' * 30}{i}")  # PAX headers: not counted
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    counter = TarCounter(10)
    for start in range(0, len(blob), 333):  # pieces that split headers
        counter.feed(blob[start : start + 333])
    counter.finish()
    assert counter.entries == 5
    with pytest.raises(SnapshotError, match="more than 4 entries"):
        TarCounter(4).feed(blob)
    short = TarCounter(10)
    short.feed(blob[:1000])
    with pytest.raises(SnapshotError, match="ended early"):
        short.finish()
    with pytest.raises(SnapshotError, match="not a tar"):
        TarCounter(10).feed(b"\x07" * 512)
