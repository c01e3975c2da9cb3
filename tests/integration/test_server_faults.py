"""The server killed with SIGKILL mid-call, then restarted: leftovers adopted, removed,
restored or kept."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx2
import nbformat
import pytest

from kernel_sandbox.server.labels import SERVER_KEY_LABEL
from kernel_sandbox.server.restart import leftovers, remove_leftovers
from tests.integration.serving import KEY_A, KEY_B, Server, client
from tests.waiting import await_for

# each test SIGKILLs a server, leaving its sandboxes ownerless until it is started again
pytestmark = [pytest.mark.integration, pytest.mark.orphans]


async def _killed_mid_call(server: Server) -> tuple[str, str]:
    """Start two sandboxes, one call running in the first, SIGKILL the server."""
    async with client(server) as c:
        sid = (await c.post("/v1/sandboxes", json={})).json()["id"]
        other = (await c.post("/v1/sandboxes", json={})).json()["id"]
        done = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": "x = 1\nprint('before')"})
        assert done.json()["status"] == "ok"

        def recorded() -> bool:  # the server writes behind (--record-flush-delay)
            notebooks = server.record_dir.rglob(f"{sid}.ipynb")
            return any("print('before')" in path.read_text() for path in notebooks)

        await await_for(recorded, 30, 0.05, "the first call to be on disk")
        code = "import time\nopen('started', 'w').close()\ntime.sleep(30)"
        running = asyncio.ensure_future(c.post(f"/v1/sandboxes/{sid}/python", json={"code": code}))

        async def started() -> bool:
            answer = await c.get(f"/v1/sandboxes/{sid}/exists", params={"path": "started"})
            return bool(answer.json()["exists"])

        await await_for(started, 60, 0.1, "the call to start")
        server.kill(signal.SIGKILL)
        with pytest.raises(httpx2.HTTPError):
            await running
    return sid, other


async def _written(tmp_path, sid: str, last: str) -> tuple[nbformat.NotebookNode, list[str]]:  # type: ignore[no-untyped-def]
    """The sandbox's notebook once its last code cell is ``last`` (fails after 30 s): the
    server writes behind (--record-flush-delay, 0.25 s)."""

    def written() -> tuple[nbformat.NotebookNode, list[str]] | None:
        now = nbformat.read(next(tmp_path.rglob(f"{sid}.ipynb")), as_version=4)
        nbformat.validate(now)
        sources = [cell.source for cell in now.cells if cell.cell_type == "code"]
        return (now, sources) if sources and sources[-1] == last else None

    return await await_for(written, 30, 0.05, f"the notebook's last cell to be {last!r}")


async def test_sigkill_then_restart_removes_leftovers_and_notebooks_stay_valid(
    docker_engine,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    server = Server(f"t-fault-{os.getpid()}", tmp_path, ["--on-restart", "remove"]).start()
    try:
        sid, other = await _killed_mid_call(server)
        left = await leftovers(server.name)
        assert len(left) == 2  # the killed server could not clean up
        labels = [row.labels for row in left]
        assert all(KEY_A not in str(lab) and lab[SERVER_KEY_LABEL] for lab in labels)
        for path in (tmp_path.rglob(f"{sid}.ipynb"), tmp_path.rglob(f"{other}.ipynb")):
            nb = nbformat.read(next(path), as_version=4)
            nbformat.validate(nb)
        recorded = nbformat.read(next(tmp_path.rglob(f"{sid}.ipynb")), as_version=4)
        assert any("print('before')" in cell.source for cell in recorded.cells)
        server.start()  # on_restart=remove
        assert await leftovers(server.name) == []
        async with client(server) as c:
            assert (await c.get(f"/v1/sandboxes/{sid}")).status_code == 404
            fresh = (await c.post("/v1/sandboxes", json={})).json()["id"]
            ran = await c.post(f"/v1/sandboxes/{fresh}/python", json={"code": "1 + 1"})
            assert ran.json()["status"] == "ok"
    finally:
        server.stop()
    assert await leftovers(server.name) == []  # a graceful stop removes everything


async def test_on_restart_keep_leaves_them_for_ps_and_gc(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = Server(f"t-keep-{os.getpid()}", tmp_path, ["--on-restart", "keep"]).start()
    try:
        await _killed_mid_call(server)
        server.start()
        assert len(await leftovers(server.name)) == 2
    finally:
        server.kill(signal.SIGTERM)
        await remove_leftovers(server.name)
    assert await leftovers(server.name) == []


async def test_on_restart_restore_gives_each_key_its_sandbox_back(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = Server(f"t-restore-{os.getpid()}", tmp_path, ["--on-restart", "restore"]).start()
    try:
        sid, other = await _killed_mid_call(server)
        async with client(server.start()) as c, client(server, KEY_B) as b:
            assert (await b.get(f"/v1/sandboxes/{sid}")).status_code == 404  # still A's only
            mine = {s["id"] for s in (await c.get("/v1/sandboxes")).json()}
            assert mine == {sid, other}  # same ids, same key
            ran = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": "x + 1"})
            assert ran.json()["status"] == "ok"  # `x = 1` was replayed
            assert ran.json()["outputs"][-1]["data"]["text/plain"] == "2"
            notes = (await c.get(f"/v1/sandboxes/{sid}")).json()["notes"]
            assert any("restored" in note for note in notes)
        assert len(await leftovers(server.name)) == 2  # the new containers, not the old
        earlier = list(tmp_path.rglob(f"{sid}.before-restart-*.ipynb"))
        assert len(earlier) == 1
        nbformat.validate(nbformat.read(earlier[0], as_version=4))
        _, sources = await _written(tmp_path, sid, "x + 1")
        assert "x = 1\nprint('before')" in sources  # replayed, recorded again
        assert sources[-1] == "x + 1"
    finally:
        server.stop()
    assert await leftovers(server.name) == []


@pytest.mark.parametrize("pool", [[], ["--pool-size", "1"]], ids=["own", "pool-member"])
async def test_sigkill_then_restart_adopts_the_running_sandboxes(
    docker_engine,  # type: ignore[no-untyped-def]
    tmp_path,
    pool: list[str],
) -> None:
    """The default: the same kernels come back to their keys, variables and all (a pool
    member handed to a key too: its owner is known by its notebook's directory)."""
    server = Server(f"t-adopt-{os.getpid()}", tmp_path, pool).start()
    try:
        sid, other = await _killed_mid_call(server)
        before = {  # (an idle pool member is not adopted: it has no owner)
            row.resource_id
            for row in await leftovers(server.name)
            if row.labels.get("kernel-sandbox.id") in (sid, other)
        }
        assert len(before) == 2
        async with client(server.start()) as c, client(server, KEY_B) as b:
            assert (await b.get(f"/v1/sandboxes/{sid}")).status_code == 404  # still A's only
            mine = {s["id"] for s in (await c.get("/v1/sandboxes")).json()}
            assert mine == {sid, other}  # same ids, same key
            ran = await c.post(f"/v1/sandboxes/{sid}/python", json={"code": "x + 1"})
            assert ran.json()["status"] == "ok"  # `x = 1` is still there: no replay, no restart
            assert ran.json()["outputs"][-1]["data"]["text/plain"] == "2"
            notes = (await c.get(f"/v1/sandboxes/{sid}")).json()["notes"]
            assert any("adopted" in note for note in notes)
            # the running call was interrupted, the kernel answers at once
            ran = await c.post(f"/v1/sandboxes/{other}/python", json={"code": "2 * 21"})
            assert ran.json()["outputs"][-1]["data"]["text/plain"] == "42"
        now_ids = {row.resource_id for row in await leftovers(server.name)}
        assert before <= now_ids  # the same containers (plus a new idle pool member)
        labels = [row.labels for row in await leftovers(server.name)]
        assert all(KEY_A not in str(lab) for lab in labels)
        now, sources = await _written(tmp_path, sid, "x + 1")
        assert sources[0] == "x = 1\nprint('before')"  # the old cells, then the new ones
        assert sources[-1] == "x + 1"
        assert any("adopted after a server restart" in cell.source for cell in now.cells)
    finally:
        server.stop()
    assert await leftovers(server.name) == []
