"""``serve --workers 2`` behind E2B's API: any worker serves any E2B sandbox.

E2B's record of a sandbox (its envd token, timeout, metadata, paused flag) is on the
shared record directory, so a sandbox created through one worker is run, timed, paused,
resumed, listed and killed through the other.  Every request goes on a connection of its
own, so the kernel hands it to whichever worker accepts first (the one that answered
names itself in ``x-kernel-sandbox-worker``); a check that needs both workers calls until
both have answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.server.e2b.shared import RECORDS_DIR
from kernel_sandbox.server.workers import WORKER_HEADER
from tests.integration.serving import KEY_A, KEY_B, Server, appended
from tests.waiting import await_for

pytestmark = pytest.mark.usefixtures("docker_engine")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    made = Server(f"t-workers-e2b-{os.getpid()}", tmp_path / "nb", ["--workers", "2"])
    made.log = tmp_path / "server.log"
    made.start()
    try:
        yield made
    finally:
        made.stop()


async def call(
    server: Server, method: str, path: str, headers: dict[str, str], **kw: Any
) -> httpx2.Response:
    """One request on a connection of its own (any worker may take it)."""
    async with httpx2.AsyncClient(base_url=server.url, timeout=120) as client:
        return await client.request(  # type: ignore[no-any-return]
            method, path, headers={**headers, "Connection": "close"}, **kw
        )


#: A sandbox that outlives the test (E2B's default timeout is 15 s).
NEW = {"templateID": "base", "timeout": 600}


def api(key: str = KEY_A) -> dict[str, str]:
    return {"X-API-Key": key}


def envd(made: dict[str, Any], port: int = 49999) -> dict[str, str]:
    """The headers E2B's SDK sends on a call into the sandbox."""
    return {
        "E2b-Sandbox-Id": made["sandboxID"],
        "E2b-Sandbox-Port": str(port),
        "X-Access-Token": made["envdAccessToken"],
    }


def run_raw(server: Server, made: dict[str, Any]) -> Awaitable[httpx2.Response]:
    """``/execute`` of one cell, answered as it is."""
    return call(server, "POST", "/e2b/sandbox/execute", envd(made), json={"code": "1"})


async def execute(server: Server, made: dict[str, Any], code: str) -> tuple[str, str]:
    """The code interpreter's ``/execute``: what the cell printed, and the worker."""
    r = await call(server, "POST", "/e2b/sandbox/execute", envd(made), json={"code": code})
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert not [line for line in lines if line["type"] == "error"], lines
    out = "".join(line["text"] for line in lines if line["type"] == "stdout")
    return out.strip(), r.headers[WORKER_HEADER]


async def on_both(
    calls: Callable[[], Awaitable[httpx2.Response]], tries: int = 40
) -> list[httpx2.Response]:
    """Make the same call until both workers answered it; every answer."""
    answers, seen = [], set()
    for _ in range(tries):
        answers.append(await calls())
        seen.add(answers[-1].headers[WORKER_HEADER])
        if len(seen) == 2:
            return answers
    raise AssertionError(f"one worker answered every call: {seen}")


async def test_an_e2b_sandbox_is_served_by_every_worker(server: Server) -> None:
    r = await call(server, "POST", "/e2b/sandboxes", api(), json=NEW)
    assert r.status_code == 201, r.text
    made, maker = r.json(), r.headers[WORKER_HEADER]
    sid = made["sandboxID"]
    record = server.record_dir / RECORDS_DIR / f"{sid}.json"
    assert record.stat().st_mode & 0o777 == 0o600  # it holds the envd token
    # code through both workers, one kernel: each call its own answer
    answered, n = set(), 0
    while len(answered) < 2 or n < 6:
        out, worker = await execute(server, made, f"n = {n}; print(n * 2)")
        assert out == str(n * 2)
        answered.add(worker)
        n += 1
        assert n < 40, f"one worker answered every call: {answered}"
    assert maker in answered
    assert (await execute(server, made, "print(n)"))[0] == str(n - 1)
    # envd's filesystem through both workers
    for r in await on_both(
        lambda: call(
            server,
            "POST",
            "/e2b/sandbox/filesystem.Filesystem/Stat",
            envd(made, 49983),
            json={"path": "/home/user"},
        )
    ):
        assert r.status_code == 200, r.text
        assert r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    # a timeout set through one worker is the sandbox's on every worker
    r = await call(server, "POST", f"/e2b/sandboxes/{sid}/timeout", api(), json={"timeout": 3000})
    assert r.status_code == 204, r.text
    ends = set()
    for r in await on_both(lambda: call(server, "GET", f"/e2b/sandboxes/{sid}", api())):
        assert r.status_code == 200, r.text
        assert r.json()["envdAccessToken"] == made["envdAccessToken"]
        ends.add(r.json()["endAt"])
    assert len(ends) == 1
    # tenancy: key B finds nothing on either worker
    for r in await on_both(lambda: call(server, "GET", f"/e2b/sandboxes/{sid}", api(KEY_B))):
        assert r.status_code == 404, r.text
    for r in await on_both(lambda: call(server, "GET", "/e2b/v2/sandboxes", api(KEY_B))):
        assert r.json() == []
    # a wrong token is refused by both
    for r in await on_both(lambda: run_raw(server, {**made, "envdAccessToken": "x" * 43})):
        assert r.status_code == 401, r.text
    # paused through one worker: paused for both; resumed by either, variables kept
    assert (await call(server, "POST", f"/e2b/sandboxes/{sid}/pause", api())).status_code == 204
    for r in await on_both(lambda: run_raw(server, made)):  # E2B's connect resumes, not a call
        assert r.status_code == 502 and "paused" in r.text, r.text  # E2B's proxy's answer
    for r in await on_both(lambda: call(server, "GET", "/e2b/v2/sandboxes", api())):
        assert [(s["sandboxID"], s["state"]) for s in r.json()] == [(sid, "paused")]
    r = await call(server, "POST", f"/e2b/sandboxes/{sid}/connect", api(), json={"timeout": 300})
    assert r.status_code == 201, r.text
    for _ in range(6):
        assert (await execute(server, made, "print(n)"))[0] == str(n - 1)
    # killed through one worker: gone on both, the container and the record too
    assert (await call(server, "DELETE", f"/e2b/sandboxes/{sid}", api())).status_code == 204
    for r in await on_both(lambda: call(server, "GET", f"/e2b/sandboxes/{sid}", api())):
        assert r.status_code == 404, r.text
    for r in await on_both(lambda: run_raw(server, made)):
        assert r.status_code == 502 and "not found" in r.text, r.text
    assert not record.exists()
    rows = await DockerHost.list_sandboxes({"kernel-sandbox.server": server.name})
    assert [row for row in rows if row.labels.get("kernel-sandbox.id") == sid] == []


async def test_clients_spreading_executes_keep_every_cell_once_in_order(server: Server) -> None:
    r = await call(server, "POST", "/e2b/sandboxes", api(), json=NEW)
    assert r.status_code == 201, r.text
    made = r.json()
    await execute(server, made, "ran = []")
    sent: list[int] = []
    answered: set[str] = set()
    counter = iter(range(1_000_000))
    end = time.monotonic() + 15

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < end:
            n = next(counter)
            out, worker = await execute(server, made, f"ran.append({n}); print({n})")
            assert out == str(n)  # its own result, never another call's
            sent.append(n)
            answered.add(worker)
            await asyncio.sleep(rng.random() / 100)

    # four: each /execute is a stream, and a key holds four at once by default
    await asyncio.gather(*(client(seed) for seed in range(4)))
    assert len(answered) == 2
    ran = json.loads((await execute(server, made, "import json; print(json.dumps(ran))"))[0])
    assert sorted(ran) == sorted(sent)  # every call ran once
    nb = (await call(server, "GET", f"/v1/sandboxes/{made['sandboxID']}/notebook", api())).json()
    assert appended(nb) == ran  # every cell once, in the order the kernel ran them


async def test_a_timeout_ends_the_sandbox_once_for_both_workers(server: Server) -> None:
    body = {"templateID": "base", "timeout": 2}
    r = await call(server, "POST", "/e2b/sandboxes", api(), json=body)
    assert r.status_code == 201, r.text
    made = r.json()
    sid = made["sandboxID"]
    record = server.record_dir / RECORDS_DIR / f"{sid}.json"

    async def gone() -> bool:
        rows = await DockerHost.list_sandboxes({"kernel-sandbox.server": server.name})
        return not record.exists() and not [
            row for row in rows if row.labels.get("kernel-sandbox.id") == sid
        ]

    await await_for(gone, 60, what="the sandbox past its timeout to be removed")
    for r in await on_both(lambda: call(server, "GET", f"/e2b/sandboxes/{sid}", api())):
        assert r.status_code == 404, r.text
