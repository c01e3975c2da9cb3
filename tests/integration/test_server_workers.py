"""``serve --workers 2``: any worker serves any sandbox, through one port.

Every call goes on a connection of its own (``Connection: close``), so the kernel's
listening socket hands it to whichever worker accepts first; the worker that answered
names itself in ``x-kernel-sandbox-worker``.  A test that needs both workers calls until
both have answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.server import replicas
from kernel_sandbox.server.auth import key_id
from kernel_sandbox.server.workers import WORKER_HEADER
from tests.integration.serving import KEY_A, KEY_B, Server, appended, code_cells, text
from tests.waiting import await_for

pytestmark = pytest.mark.usefixtures("docker_engine")


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    made = Server(f"t-workers-{os.getpid()}", tmp_path, ["--workers", "2"]).start()
    try:
        yield made
    finally:
        made.stop()


async def call(
    server: Server, method: str, path: str, key: str = KEY_A, **kw: object
) -> httpx2.Response:
    """One request on a connection of its own (any worker may take it)."""
    headers = {"X-API-Key": key, "Connection": "close"}
    async with httpx2.AsyncClient(base_url=server.url, headers=headers, timeout=60) as c:
        return await c.request(method, path, **kw)  # type: ignore[arg-type]


async def run(server: Server, sid: str, code: str, key: str = KEY_A) -> httpx2.Response:
    return await call(server, "POST", f"/v1/sandboxes/{sid}/python", key, json={"code": code})


async def test_made_by_one_worker_run_by_the_other_one_notebook(server: Server) -> None:
    made = await call(server, "POST", "/v1/sandboxes", json={})
    assert made.status_code == 200, made.text
    sid, maker = made.json()["id"], made.headers[WORKER_HEADER]
    sent, answered = [], set()
    for n in range(40):  # until both workers ran code, and a few calls more
        code = f"n = {n}; print(n * 2)"
        r = await run(server, sid, code)
        assert text(r) == str(n * 2)  # each call its own answer, whichever worker
        sent.append(code)
        answered.add(r.headers[WORKER_HEADER])
        if len(answered) == 2 and n >= 5:
            break
    assert len(answered) == 2, f"one worker answered every call: {answered}"
    assert maker in answered
    # the variables are the kernel's, whichever worker asks
    assert text(await run(server, sid, "print(n)")) == str(len(sent) - 1)
    sent.append("print(n)")
    seen = set()
    for _ in range(20):  # the notebook through every worker: one notebook, in order
        r = await call(server, "GET", f"/v1/sandboxes/{sid}/notebook")
        assert r.status_code == 200, r.text
        assert code_cells(r.json()) == sent
        seen.add(r.headers[WORKER_HEADER])
        if len(seen) == 2:
            break
    assert len(seen) == 2
    # tenancy: key B gets 404 from every worker; so does a path-like id
    seen = set()
    for _ in range(20):
        r = await run(server, sid, "print('not yours')", key=KEY_B)
        assert r.status_code == 404, r.text
        assert (await call(server, "GET", f"/v1/sandboxes/{sid}", key=KEY_B)).status_code == 404
        seen.add(r.headers[WORKER_HEADER])
        if len(seen) == 2:
            break
    assert len(seen) == 2
    listed = (await call(server, "GET", "/v1/sandboxes", key=KEY_B)).json()
    assert [s["id"] for s in listed] == []
    assert (await run(server, "..%2F..%2Fetc", "1")).status_code == 404
    nb_b = server.record_dir / key_id(KEY_B) / f"{sid}.ipynb"
    assert not nb_b.exists()
    # deleted through one worker: gone on every worker, its container too
    assert (await call(server, "DELETE", f"/v1/sandboxes/{sid}")).status_code == 200
    seen = set()
    for _ in range(20):
        r = await run(server, sid, "1")
        assert r.status_code == 404, r.text
        seen.add(r.headers[WORKER_HEADER])
        if len(seen) == 2:
            break
    assert len(seen) == 2
    rows = await DockerHost.list_sandboxes({"kernel-sandbox.server": server.name})
    assert [row for row in rows if row.labels.get("kernel-sandbox.id") == sid] == []


async def test_clients_spreading_calls_keep_every_cell_once_in_order(server: Server) -> None:
    sids = []
    for _ in range(3):
        r = await call(server, "POST", "/v1/sandboxes", json={})
        assert r.status_code == 200, r.text
        sids.append(r.json()["id"])
    for sid in sids:
        assert (await run(server, sid, "ran = []")).status_code == 200
    sent: dict[str, list[int]] = {sid: [] for sid in sids}
    answered: set[str] = set()
    counter = iter(range(1_000_000))
    end = time.monotonic() + 20

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < end:
            sid, n = rng.choice(sids), next(counter)
            r = await run(server, sid, f"ran.append({n}); print({n})")
            assert text(r) == str(n), r.text  # its own result, never another call's
            sent[sid].append(n)
            answered.add(r.headers[WORKER_HEADER])

    await asyncio.gather(*(client(seed) for seed in range(6)))
    assert len(answered) == 2
    for sid in sids:
        ran = json.loads(text(await run(server, sid, "import json; print(json.dumps(ran))")))
        assert sorted(ran) == sorted(sent[sid])  # every call ran once
        nb = (await call(server, "GET", f"/v1/sandboxes/{sid}/notebook")).json()
        assert appended(nb) == ran  # every cell once, in the order the kernel ran them


async def test_paused_on_one_worker_resumed_once_by_calls_on_both(server: Server) -> None:
    made = await call(server, "POST", "/v1/sandboxes", json={})
    sid = made.json()["id"]
    # every worker holds it first, so each has it cached when another pauses it
    seen: set[str] = set()
    for _ in range(40):
        r = await run(server, sid, "v = 42; print(v)")
        assert text(r) == "42"
        seen.add(r.headers[WORKER_HEADER])
        if len(seen) == 2:
            break
    assert len(seen) == 2
    paused = await call(server, "POST", f"/v1/sandboxes/{sid}/pause")
    assert paused.status_code == 200, paused.text
    rows = await DockerHost.list_sandboxes({"kernel-sandbox.server": server.name})
    assert rows == []  # its container went
    # ten calls at once on fresh connections (both workers): one resume, same state
    answers = await asyncio.gather(*(run(server, sid, "print(v)") for _ in range(10)))
    assert [text(r) for r in answers] == ["42"] * 10
    after, calls = {r.headers[WORKER_HEADER] for r in answers}, 10
    while after != seen and calls < 50:  # both workers serve the resumed one
        r = await run(server, sid, "print(v)")
        assert text(r) == "42"
        after.add(r.headers[WORKER_HEADER])
        calls += 1
    assert after == seen
    rows = await DockerHost.list_sandboxes({"kernel-sandbox.server": server.name})
    assert len(rows) == 1, rows  # resumed once, not once per worker
    snaps = (await call(server, "GET", "/v1/snapshots")).json()
    assert [s for s in snaps if s.get("paused")] == []  # the pause snapshot was consumed
    nb = (await call(server, "GET", f"/v1/sandboxes/{sid}/notebook")).json()
    assert code_cells(nb).count("print(v)") == calls
    assert (await call(server, "DELETE", f"/v1/sandboxes/{sid}")).status_code == 200
    assert (await run(server, sid, "print(v)")).status_code == 404


@pytest.mark.orphans  # a killed worker, then gc
async def test_worker_killed_mid_call(server: Server) -> None:
    made = await call(server, "POST", "/v1/sandboxes", json={})
    sid = made.json()["id"]
    assert text(await run(server, sid, "v = 42; print(v)")) == "42"
    state = server.record_dir / key_id(KEY_A) / f"{sid}.lock"
    slow = asyncio.ensure_future(run(server, sid, "import time; time.sleep(30); print('late')"))

    def held() -> bool:  # the worker in the call holds the lock
        assert not slow.done()
        return bool(replicas.holder(state))

    await await_for(held, 30, what="the call's worker to hold the lock")
    victim = int(replicas.holder(state).split(":")[1])  # host:pid:nonce
    os.kill(victim, signal.SIGKILL)
    try:  # the caller gets an answer or an error, never silence
        answer = await asyncio.wait_for(slow, 60)
        assert answer.status_code >= 500 or "late" in answer.text
    except httpx2.HTTPError:
        pass
    # the sandbox is still served (another worker, or the one started in its place),
    # with its variables; the call nobody waits for is interrupted, not waited for
    started = time.monotonic()
    r = await run(server, sid, "print(v)")
    assert text(r) == "42", r.text
    assert time.monotonic() - started < 25  # not behind the dead worker's 30 s sleep
    assert int(r.headers[WORKER_HEADER]) != victim
    nb = (await call(server, "GET", f"/v1/sandboxes/{sid}/notebook")).json()
    assert code_cells(nb)[-1] == "print(v)"
    assert any("worker died" in "".join(c["source"]) for c in nb["cells"])
    # gc does not take what a live worker serves, though the worker that made it died
    leftovers = await DockerHost.gc()
    assert not [left for left in leftovers if sid in str(left)]
    # the supervisor started a worker in the dead one's place: two answer again
    seen: set[int] = set()
    for _ in range(40):
        r = await run(server, sid, "print(v)")
        assert text(r) == "42"
        seen.add(int(r.headers[WORKER_HEADER]))
        if len(seen) == 2:
            break
    assert len(seen) == 2 and victim not in seen


async def test_idle_sandbox_reaped_once_used_one_kept(tmp_path: Path) -> None:
    server = Server(
        f"t-workers-reap-{os.getpid()}", tmp_path, ["--workers", "2", "--idle-timeout", "4"]
    ).start()
    try:
        used = (await call(server, "POST", "/v1/sandboxes", json={})).json()["id"]
        idle = (await call(server, "POST", "/v1/sandboxes", json={})).json()["id"]
        assert (await run(server, idle, "1")).status_code == 200
        end = time.monotonic() + 12  # thrice the idle timeout, calls every second
        while time.monotonic() < end:
            assert text(await run(server, used, "print('here')")) == "here"
            await asyncio.sleep(1)
        assert (await run(server, idle, "1")).status_code == 404
        assert text(await run(server, used, "print('still')")) == "still"
        rows = await DockerHost.list_sandboxes({"kernel-sandbox.server": server.name})
        assert {row.labels.get("kernel-sandbox.id") for row in rows} == {used}
        nb = json.loads((server.record_dir / key_id(KEY_A) / f"{idle}.ipynb").read_text())
        assert nb["metadata"]["kernel_sandbox"]["reason"] == "idle timeout"
    finally:
        server.stop()


async def test_mcp_calls_through_both_workers_share_the_keys_sandbox(server: Server) -> None:
    """MCP without sessions (several workers): any worker answers, one sandbox per key."""
    workers: set[str] = set()

    async def seen(response: httpx2.Response) -> None:
        workers.add(response.headers[WORKER_HEADER])

    async def session_of(key: str, codes: list[str], **extra: str) -> list[str]:
        """One MCP client (a connection of its own per request), the printed texts."""
        headers = {"Authorization": f"Bearer {key}", "Connection": "close", **extra}
        hooks = {"response": [seen]}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120, event_hooks=hooks) as http,
            streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            texts = []
            for code in codes:
                result = await session.call_tool("run_python", {"code": code})
                assert not result.is_error, result.content
                texts.append(result.content[0].text)  # type: ignore[union-attr]
            return texts

    sent, total = [], 0
    for n in range(12):  # clients one after another, until both workers answered
        codes = [f"total = globals().get('total', 0) + {n}; print(total)"]
        total += n
        assert await session_of(KEY_A, codes) == [str(total)]  # the same kernel every time
        sent += codes
        if len(workers) == 2 and n >= 3:
            break
    assert len(workers) == 2, f"one worker answered every call: {workers}"
    listed = (await call(server, "GET", "/v1/sandboxes")).json()
    assert len(listed) == 1  # one sandbox for the key, whichever worker took the call
    nb = (await call(server, "GET", f"/v1/sandboxes/{listed[0]['id']}/notebook")).json()
    assert code_cells(nb) == sent
    # a session header names nothing here: the key's sandbox, and no file more per value
    for made_up in ("made-up-1", "made-up-2"):
        said = await session_of(KEY_A, ["print(total)"], **{"mcp-session-id": made_up})
        assert said == [str(total)]
    assert len(list((server.record_dir / key_id(KEY_A)).glob(".mcp-*"))) == 1
    # another key's calls get a sandbox of their own
    assert await session_of(KEY_B, ["print(globals().get('total'))"]) == ["None"]
