"""Three server replicas on the real cluster: any replica serves any sandbox, and a
replica that dies loses no session.

deploy/kubernetes applied with ``replicas: 3`` (:mod:`tests.kubernetes.deployment`):
each replica is a pod of its own with its own address, reached here directly (the
test cluster has no kube-proxy to route the Service), so a test chooses which replica
takes each call and every answer names the replica that gave it
(``x-kernel-sandbox-worker``: pod name and pid).  The shared volume is a hostPath on
the node (the ``kubernetes-local`` overlay).  ``--idle-timeout 40`` makes the reaper's
pass 10 s and its Lease's duration 30 s, so a dead holder's turn passes to a live
replica within a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from kernel_sandbox.backends.kubernetes.host import POD_GONE_DEADLINE
from kernel_sandbox.server import replicas
from kernel_sandbox.server.auth import key_id
from kernel_sandbox.server.election import lease_name
from kernel_sandbox.server.workers import WORKER_HEADER
from tests.conftest import require
from tests.integration.serving import code_cells, text
from tests.kubernetes.deployment import (
    Deployed,
    deploy,
    local_cluster,
    ready_replicas,
    server_pid,
)
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes

KEY_A, KEY_B = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
#: The reaper's pass and its Lease's duration with --idle-timeout 40 (election.py).
TICK, LEASE = 10.0, 30


@pytest.fixture(scope="module")
def three(namespace: str, server_image: str) -> Iterator[Deployed]:
    with deploy(namespace, 3, [KEY_A, KEY_B], args=("--idle-timeout", "40")) as d:
        yield d


async def call(
    url: str, method: str, path: str, key: str = KEY_A, timeout: float = 60, **kw: Any
) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=timeout) as c:
        return await c.request(method, path, **kw)


async def run(url: str, sid: str, code: str, key: str = KEY_A, **kw: Any) -> httpx2.Response:
    return await call(url, "POST", f"/v1/sandboxes/{sid}/python", key, json={"code": code}, **kw)


def replica(response: httpx2.Response) -> str:
    """The pod that answered."""
    return response.headers[WORKER_HEADER].split(":")[0]


async def create(url: str, key: str = KEY_A) -> str:
    made = await call(url, "POST", "/v1/sandboxes", key, json={})
    assert made.status_code == 200, made.text
    return str(made.json()["id"])


def test_made_on_one_replica_run_on_another_recorded_on_a_third(three: Deployed) -> None:
    (a, url_a), (b, url_b), (c, url_c) = three.urls.items()

    async def scenario() -> None:
        made = await call(url_a, "POST", "/v1/sandboxes", json={})
        assert made.status_code == 200 and replica(made) == a, made.text
        sid = made.json()["id"]
        first = await run(url_b, sid, "x = 21")
        assert first.status_code == 200 and replica(first) == b, first.text
        second = await run(url_c, sid, "print(x * 2)")
        assert text(second) == "42" and replica(second) == c
        assert text(await run(url_a, sid, "print(x + 1)")) == "22"
        for url in three.urls.values():  # one notebook, whichever replica reads it
            nb = (await call(url, "GET", f"/v1/sandboxes/{sid}/notebook")).json()
            assert code_cells(nb) == ["x = 21", "print(x * 2)", "print(x + 1)"]
        # tenancy on every replica: another key's sandbox does not exist for key B
        for url in three.urls.values():
            assert (await call(url, "GET", f"/v1/sandboxes/{sid}", KEY_B)).status_code == 404
            assert (await run(url, sid, "print(x)", KEY_B)).status_code == 404
            listed = await call(url, "GET", "/v1/sandboxes", KEY_B)
            assert listed.status_code == 200 and listed.json() == []
            mine = await call(url, "GET", "/v1/sandboxes")
            assert sid in [s["id"] for s in mine.json()]
        deleted = await call(url_b, "DELETE", f"/v1/sandboxes/{sid}")
        assert deleted.status_code == 200, deleted.text
        for url in three.urls.values():  # gone for every replica, made or cached
            assert (await run(url, sid, "print(x)")).status_code == 404

    asyncio.run(scenario())


def test_twenty_clients_spreading_calls_keep_every_cell_once_in_order(three: Deployed) -> None:
    urls = list(three.urls.values())

    async def scenario() -> None:
        sids = [await create(urls[i % 3]) for i in range(4)]
        for sid in sids:
            assert (await run(urls[0], sid, "ran = []")).status_code == 200
        sent: dict[str, list[int]] = {sid: [] for sid in sids}
        answered: set[str] = set()
        counter = iter(range(1_000_000))
        end = time.monotonic() + 60

        async def client(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < end:
                sid, n, url = rng.choice(sids), next(counter), rng.choice(urls)
                r = await run(url, sid, f"ran.append({n}); print({n})")
                assert text(r) == str(n), r.text  # its own result, never another call's
                sent[sid].append(n)
                answered.add(replica(r))

        await asyncio.gather(*(client(seed) for seed in range(20)))
        assert answered == set(three.urls)
        calls = sum(len(v) for v in sent.values())
        print(f"\n[replicas] 20 clients, 3 replicas, 60 s: {calls} calls")

        async def check(sid: str) -> None:
            ran = json.loads(text(await run(urls[1], sid, "import json; print(json.dumps(ran))")))
            assert sorted(ran) == sorted(sent[sid])  # every call ran once
            nb = (await call(urls[2], "GET", f"/v1/sandboxes/{sid}/notebook")).json()
            recorded = [
                int(code.removeprefix("ran.append(").split(")")[0])
                for code in code_cells(nb)
                if code.startswith("ran.append(")
            ]
            assert recorded == ran  # every cell once, in the order the kernel ran them

        # all at once, then the removals: a sandbox left waiting behind the others'
        # removals (a pod's takes seconds) would pass the idle timeout and be reaped
        began = time.monotonic()
        await asyncio.gather(*(check(sid) for sid in sids))
        checked = time.monotonic()
        # a removal waits until its pod is gone, up to the server's own bound: on a loaded
        # node the kubelet took longer than the client's default 60 s (seen twice in CI)
        bound = POD_GONE_DEADLINE + 30
        removed = await asyncio.gather(
            *(call(urls[0], "DELETE", f"/v1/sandboxes/{sid}", timeout=bound) for sid in sids)
        )
        assert [r.status_code for r in removed] == [200] * len(sids)
        took = f"checked in {checked - began:.1f} s, removed in {time.monotonic() - checked:.1f} s"
        print(f"[replicas] {took}")

    asyncio.run(scenario())


def _holder(kube: Any, namespace: str) -> str | None:
    """The pod holding the reaper's Lease, if its holding has not run out."""
    from kubernetes.client.exceptions import ApiException

    try:
        spec = kube.coordination.read_namespaced_lease(lease_name("default"), namespace).spec
    except ApiException as exc:  # none yet: no reaper's pass has run
        if exc.status == 404:
            return None
        raise
    if not spec.holder_identity or spec.renew_time is None:
        return None
    age = time.time() - spec.renew_time.timestamp()
    return str(spec.holder_identity).split(":")[0] if age < spec.lease_duration_seconds else None


def test_a_replica_killed_mid_call_loses_no_session(
    kube: Any, namespace: str, three: Deployed
) -> None:
    require(local_cluster(), "killing a server process needs the node: a local cluster")
    shared = three.shared
    assert shared is not None
    (victim, url_a), *others = three.urls.items()
    survivors = [url for _, url in others]

    async def scenario() -> None:
        sids = [await create(url_a) for _ in range(3)]
        for i, sid in enumerate(sids):
            assert text(await run(url_a, sid, f"v = {i}; print(v)")) == str(i)
        # the reaper's Lease is held by a replica (its first pass ran)
        await await_for(lambda: _holder(kube, namespace), TICK * 3, what="a Lease holder")
        # calls in flight on A, each holding its sandbox's call lock on the shared volume
        slow = [
            asyncio.ensure_future(run(url_a, sid, "import time; time.sleep(30); print('late')"))
            for sid in sids
        ]
        states = [shared / "notebooks" / key_id(KEY_A) / f"{sid}.lock" for sid in sids]

        def held() -> bool:
            assert not any(s.done() for s in slow)
            return all(replicas.holder(s).startswith(f"{victim}:") for s in states)

        await await_for(held, 30, what="the calls to hold their locks on replica A")
        started = time.monotonic()
        os.kill(server_pid(victim), signal.SIGKILL)  # no clean-up
        kube.core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
        for call_ in slow:  # an answer or an error, never silence
            try:
                answer = await asyncio.wait_for(call_, 60)
                assert answer.status_code >= 500 or "late" in answer.text, answer.text
            except httpx2.HTTPError:
                pass
        assert time.monotonic() - started < 60
        # every sandbox answers on the others with its variables, its dead call
        # interrupted rather than waited for
        for i, sid in enumerate(sids):
            begun = time.monotonic()
            r = await run(survivors[i % 2], sid, "print(v)")
            assert text(r) == str(i), r.text
            assert time.monotonic() - begun < 25  # not behind the dead call's 30 s sleep
            nb = (await call(survivors[0], "GET", f"/v1/sandboxes/{sid}/notebook")).json()
            assert code_cells(nb)[-1] == "print(v)"
            assert any("worker died" in "".join(c["source"]) for c in nb["cells"])

        async def in_use() -> None:  # used meanwhile (the idle timeout is 40 s)
            while True:
                for i, sid in enumerate(sids):
                    assert text(await run(survivors[i % 2], sid, "print(v)")) == str(i)
                await asyncio.sleep(5)

        using = asyncio.ensure_future(in_use())

        # a live replica holds the Lease within a duration and a pass (the Deployment
        # made a pod in the victim's place meanwhile)
        def reaper() -> str | None:
            assert not using.done()
            holder = _holder(kube, namespace)
            return holder if holder not in (None, victim) else None

        await await_for(reaper, LEASE + 2 * TICK, what="a live replica to hold the Lease")
        await asyncio.to_thread(ready_replicas, three, 3)
        holder = reaper()
        assert victim not in three.urls and holder in three.urls
        # the reaper's passes removed nothing a live replica serves
        await asyncio.sleep(TICK)
        using.cancel()
        pods = kube.core.list_namespaced_pod(namespace, label_selector="kernel-sandbox=true")
        assert len([p for p in pods.items if p.metadata.deletion_timestamp is None]) == 3
        for i, sid in enumerate(sids):  # on the Lease's holder (maybe the new replica)
            assert text(await run(three.urls[str(holder)], sid, "print(v)")) == str(i)
            assert (await call(three.url, "DELETE", f"/v1/sandboxes/{sid}")).status_code == 200

    asyncio.run(scenario())
