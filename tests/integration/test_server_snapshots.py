"""Durable sandboxes on a real ``kernel-sandbox serve``: pause/resume under the same id,
auto-pause that frees the container, resume after SIGKILL and restart, forks with child
notebooks, and keys kept apart — through /v1 and the remote client."""

from __future__ import annotations

import os

import nbformat
import pytest

from kernel_sandbox import (
    RemoteSandbox,
    RemoteSnapshots,
    SandboxNotFoundError,
    SnapshotNotFoundError,
)
from kernel_sandbox.notebook import META_KEY
from kernel_sandbox.server.restart import leftovers
from tests.conftest import require
from tests.integration.serving import KEY_A, KEY_B, Server, client
from tests.waiting import await_for

pytestmark = pytest.mark.integration


async def _paused(c, sid: str) -> None:  # type: ignore[no-untyped-def]
    async def paused() -> bool:
        return bool((await c.get(f"/v1/sandboxes/{sid}")).json()["status"] == "paused")

    await await_for(paused, 60, 0.2, f"sandbox {sid} to be paused")


async def test_auto_pause_frees_the_container_and_the_next_call_brings_it_back(
    docker_engine,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    extra = ["--pause-after", "1", "--snapshot-dir", str(tmp_path / "snaps")]
    server = Server(f"t-pause-{os.getpid()}", tmp_path / "nb", extra).start()
    try:
        async with client(server) as c, client(server, KEY_B) as b:
            sid = (await c.post("/v1/sandboxes", json={})).json()["id"]
            ran = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": "x = 41"})
            assert ran.json()["status"] == "ok"
            await _paused(c, sid)
            assert await leftovers(server.name) == []  # the container is gone
            rows = (await c.get("/ui/list.json")).json()["sandboxes"]
            assert [r["state"] for r in rows if r["id"] == sid] == ["paused"]  # the live page
            assert (
                await b.post(f"/v1/sandboxes/{sid}/python", json={"code": "1"})
            ).status_code == 404
            ran = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": "x + 1"})
            assert ran.json()["status"] == "ok", ran.json()
            assert ran.json()["outputs"][-1]["data"]["text/plain"] == "42"
            assert (await c.get(f"/v1/sandboxes/{sid}")).json()["status"] == "running"
            await _paused(c, sid)  # and again: one notebook for the whole session
        notebook = nbformat.read(
            tmp_path / "nb" / next(p.name for p in (tmp_path / "nb").iterdir()) / f"{sid}.ipynb",
            as_version=4,
        )
        sources = [cell.source for cell in notebook.cells]
        assert "x = 41" in sources and "x + 1" in sources
        assert sum("paused" in s for s in sources) == 2 and any("resumed" in s for s in sources)
        assert sum(s.startswith("# Sandbox") for s in sources) == 1  # continued, not restarted
    finally:
        server.stop()


@pytest.mark.orphans  # a killed server
async def test_a_paused_sandbox_survives_sigkill_and_forks_are_independent(
    docker_engine,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    extra = ["--snapshot-dir", str(tmp_path / "snaps")]
    server = Server(f"t-durable-{os.getpid()}", tmp_path / "nb", extra).start()
    try:
        sb = await RemoteSandbox.create(server.url, api_key=KEY_A)
        await sb.run_python("state = {'n': 1}")
        await sb.files.write("kept.txt", "on disk")
        forks = await sb.fork(2)
        await forks[0].run_python("state['n'] = 99")
        for other in (forks[1], sb):
            assert (await other.run_python("state['n']")).text == "1"
        assert (await forks[0].run_python("state['n']")).text == "99"
        meta = (await forks[1].notebook())["metadata"][META_KEY]["forked_from"]
        assert meta["sandbox"] == sb.id and meta["snapshot"].startswith("snap-")
        kept = await RemoteSnapshots(server.url, api_key=KEY_A).list()
        assert kept == []  # the fork's own snapshot does not use up the key's count

        snap = await sb.pause()
        assert snap.paused is not None
        assert (await sb.pause()).id == snap.id  # paused already: the same snapshot
        server.kill()  # SIGKILL: the pause is all that is left of it, on disk
        server.start()
        store_a = RemoteSnapshots(server.url, api_key=KEY_A)
        store_b = RemoteSnapshots(server.url, api_key=KEY_B)
        assert snap.id in {s.id for s in await store_a.list()}
        assert await store_b.list() == []
        with pytest.raises(SnapshotNotFoundError):
            await store_b.get(snap.id)
        with pytest.raises(SandboxNotFoundError):  # another key's paused sandbox: unknown
            await RemoteSandbox.resume(sb.id, store=store_b)
        resumed = await RemoteSandbox.resume(sb.id, store=store_a)
        assert resumed.id == sb.id
        assert (await resumed.run_python("state['n']")).text == "1"
        assert await resumed.files.read_text("kept.txt") == "on disk"
        await resumed.close()
        for fork in forks:
            await fork.close()
        await sb._client.aclose()
    finally:
        server.stop()


@pytest.mark.alone  # a restore from a checkpoint (see test_snapshots_exact.py)
async def test_auto_pause_of_an_exact_sandbox_keeps_its_threads_and_generators(
    docker_engine,  # type: ignore[no-untyped-def]
    tmp_path,
    monkeypatch,
) -> None:
    info = docker_engine.api.info()
    require(bool(info.get("ExperimentalBuild")), "the engine does not allow checkpoints")
    require(os.geteuid() == 0, "exact snapshots need root (the engine's checkpoint folder)")
    monkeypatch.setenv("KERNEL_SANDBOX_RUNTIME", "runsc")  # the server's sandboxes: gVisor
    extra = ["--pause-after", "1", "--snapshot-dir", str(tmp_path / "snaps")]
    server = Server(f"t-exact-{os.getpid()}", tmp_path / "nb", extra).start()
    config = {"image": "kernel-sandbox:python", "exact_snapshots": True}
    code = (
        "import threading, time\nticks = [0]\ndef tick():\n    while True:\n"
        "        ticks[0] += 1\n        time.sleep(0.02)\n"
        "threading.Thread(target=tick, daemon=True).start()\n"
        "squares = (i * i for i in range(10))\nnext(squares)"
    )
    try:
        async with client(server) as c:
            created = await c.post("/v1/sandboxes", json=config)
            assert created.status_code == 200, created.text
            sid = created.json()["id"]
            ran = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": code})
            assert ran.json()["status"] == "ok", ran.json()
            await _paused(c, sid)
            assert await leftovers(server.name) == []  # its memory is freed
            check = "before = ticks[0]; time.sleep(0.3); (next(squares), ticks[0] > before)"
            ran = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": check})
            assert ran.json()["status"] == "ok", ran.json()
            # a generator half used and a thread still counting: only the whole memory
            assert ran.json()["outputs"][-1]["data"]["text/plain"] == "(1, True)"
            snaps = (await c.get("/v1/snapshots")).json()
            assert snaps == [] or all(s["exact"] for s in snaps)
    finally:
        server.stop()
