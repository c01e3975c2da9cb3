"""Portable snapshots of real Docker sandboxes (the datascience image): what an analysis
session holds comes back; a crafted blob runs only inside a sandbox, never on the host;
a sandbox that filled its disk gives a bounded snapshot; pause frees the container."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kernel_sandbox import AsyncSandbox, LocalSnapshotStore, SnapshotError
from kernel_sandbox.config import LABEL_PREFIX
from tests.integration.conftest import TEST_LABEL

pytestmark = pytest.mark.integration

SESSION = r"""
import numpy as np, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sklearn.linear_model import LogisticRegression
import site, os, sys, importlib
frame = pd.DataFrame(
    {"kind": pd.Categorical(["a", "b", "a", "c"]), "value": [1.5, 2.0, None, 4.0]},
    index=pd.date_range("2024-03-01", periods=4, freq="D", tz="UTC"),
)
matrix = np.random.default_rng(7).normal(size=(200, 3))
labels = (matrix[:, 0] > 0).astype(int)
model = LogisticRegression().fit(matrix, labels)
plt.rcParams["lines.linewidth"] = 3.5
figure, axes = plt.subplots()
axes.plot([1, 2, 3])
axes.set_title("kept")
class Tally:
    def __init__(self):
        self.seen = {"x"}
    def add(self, v):
        self.seen.add(v)
        return self
tally = Tally().add("y")
scale = lambda v: v * 10
# a package "installed at run time": into the user's site-packages under $HOME
target = site.getusersitepackages()
os.makedirs(target, exist_ok=True)
open(os.path.join(target, "runtime_pkg.py"), "w").write("ANSWER = 42\n")
open("results.csv", "w").write(frame.to_csv())
stream = open("results.csv")
"""

CHECK = r"""
import sys, site
sys.path.insert(0, site.getusersitepackages())
import runtime_pkg
assert frame["kind"].dtype == "category" and list(frame["kind"].cat.categories) == ["a", "b", "c"]
assert str(frame.index.tz) == "UTC" and frame.index.freqstr == "D"
assert frame["value"].isna().sum() == 1
assert matrix.shape == (200, 3) and (model.predict(matrix) == labels).mean() > 0.9
assert plt.rcParams["lines.linewidth"] == 3.5
assert figure.axes[0].get_title() == "kept"
assert tally.seen == {"x", "y"} and scale(2) == 20
assert runtime_pkg.ANSWER == 42
assert open("results.csv").read().startswith(",kind,value")
print("ok", sorted(n for n in ("stream",) if n in dir()))
"""


@pytest.fixture
def store(tmp_path: Path) -> LocalSnapshotStore:
    return LocalSnapshotStore(tmp_path / "snapshots")


async def test_an_analysis_session_round_trips(make_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox()
    ran = await sandbox.run_python(SESSION)
    assert ran.status == "ok", ran.text
    snap = await sandbox.snapshot(store=store)
    assert set(snap.not_saved) == {"stream"} and "open file" in snap.not_saved["stream"]
    assert {"frame", "matrix", "model", "figure", "tally", "Tally", "scale"} <= set(snap.saved)

    restored = await AsyncSandbox.restore(snap, store=store, labels=TEST_LABEL)
    try:
        assert restored.restored is not None and restored.restored.failed == {}
        check = await restored.run_python(CHECK)
        assert check.status == "ok", check.text
        assert check.stdout.strip() == "ok []"
    finally:
        await restored.close()


async def test_a_crafted_blob_runs_only_inside_a_sandbox(make_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    marker = f"/tmp/kernel-sandbox-pwned-{secrets.token_hex(4)}"
    sandbox = await make_sandbox()
    # code in the sandbox rewrites the snapshot program: a variable whose pickle runs a
    # command when loaded (a pickle is code; the host must never be the one to load it)
    craft = f"""
import tarfile, pickle, struct, io, os
class Evil:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
_real = tarfile.TarFile.addfile
def _addfile(self, info, fileobj=None):
    if info.name == "meta/modules.json":
        data = pickle.dumps(Evil(), protocol=5)
        body = struct.pack("<QI", len(data), 0) + data
        evil = tarfile.TarInfo("ns/evil")
        evil.size = len(body)
        _real(self, evil, io.BytesIO(body))
    return _real(self, info, fileobj)
tarfile.TarFile.addfile = _addfile
"""
    assert (await sandbox.run_python(craft)).status == "ok"
    snap = await sandbox.snapshot(store=store)
    assert not Path(marker).exists()  # storing it ran nothing on the host
    restored = await AsyncSandbox.restore(snap, store=store, labels=TEST_LABEL)
    try:
        assert not Path(marker).exists()  # restoring ran nothing on the host...
        inside = await restored.run_shell(f"test -e {marker} && echo ran-inside")
        assert inside.stdout.strip() == "ran-inside"  # ...it ran in the new sandbox
    finally:
        await restored.close()


async def test_a_full_disk_gives_a_bounded_snapshot(make_sandbox, store) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image="kernel-sandbox:python", disk_limit="32m")
    fill = await sandbox.run_shell("head -c 64m /dev/urandom > fill.bin; ls -l fill.bin")
    assert "No space left" in fill.stderr
    snap = await sandbox.snapshot(store=store, tmp=True)
    assert snap.sizes["bytes"] <= 33 * 1024**2  # at most what the sandbox could hold
    with pytest.raises(SnapshotError, match="larger than"):
        await sandbox.snapshot(store=store, max_bytes=4 * 1024**2)
    assert [s.id for s in await store.list()] == [snap.id]


async def test_pause_removes_the_container_and_resume_keeps_the_id(  # type: ignore[no-untyped-def]
    make_sandbox, store, docker_engine
) -> None:
    sandbox = await make_sandbox(image="kernel-sandbox:python")
    await sandbox.run_python("import os; pid = os.getpid(); kept = 'yes'")
    label = {"label": [f"{LABEL_PREFIX}.id={sandbox.id}"]}
    assert docker_engine.containers.list(filters=label)
    await sandbox.pause(store=store)
    assert docker_engine.containers.list(all=True, filters=label) == []
    resumed = await AsyncSandbox.resume(sandbox.id, store=store)
    try:
        assert resumed.id == sandbox.id
        assert (await resumed.run_python("kept")).text == "'yes'"
    finally:
        await resumed.close()
