"""The in-cluster server: deploy/kubernetes applied, ``kernel-sandbox serve`` running in a
pod with the ServiceAccount's credentials, answering ms-enclave's own client.

The manifests go into the session's namespace (:mod:`tests.kubernetes.deployment`), with
one replica here (three: test_replicas.py).  ms-enclave's ``HttpSandboxManager`` runs in
its own virtualenv (the ``enclave_python`` fixture) in three separate processes, so the
state that persists is the server's, not a client's.

One deployment serves the module: the client's test, then a server killed with SIGKILL
(what an OOM kill does) whose container the kubelet starts again in the same pod: the
new process finds the sandbox by its state file on the shared volume and its pod by its
labels on the cluster, and serves it (the same pod and kernel, its variables kept), so
ms-enclave's client goes on with it as if nothing happened.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.kubernetes.conftest import ROOT
from tests.kubernetes.deployment import (
    Deployed,
    deploy,
    local_cluster,
    ready_replicas,
    server_pid,
)
from tests.kubernetes.test_deploy import KUBECTL
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes

CLIENT = r"""
import asyncio, json, sys
from ms_enclave.sandbox.manager import HttpSandboxManager
from ms_enclave.sandbox.model import DockerSandboxConfig, SandboxType

async def main(url, key):
    # one step per line read; one JSON line written per step (the test looks at the
    # cluster in between)
    async with HttpSandboxManager(base_url=url, api_key=key, timeout=300) as manager:
        sid = None
        for step in sys.stdin:
            step = step.strip()
            if step == "create":
                # the cluster's image (ms-enclave's default, python:3.11-slim, is not there)
                config = DockerSandboxConfig(image="kernel-sandbox:python",
                                             tools_config={"python_executor": {}})
                sid = await manager.create_sandbox(SandboxType.DOCKER, config)
                info = await manager.get_sandbox_info(sid)
                r = await manager.execute_tool(sid, "python_executor", {"code": "x = 20"})
                out = {"sid": sid, "status": info.status.value, "set": r.status.value,
                       "health": (await manager.health_check())["healthy"]}
            elif step == "use":
                code = {"code": "print(x * 2 + 2)"}
                r = await manager.execute_tool(sid, "python_executor", code)
                e = await manager.execute_tool(sid, "python_executor", {"code": "1/0"})
                out = {"status": r.status.value, "output": r.output, "error": e.error,
                       "listed": [i.id for i in await manager.list_sandboxes()]}
            elif step == "health":
                out = {"health": (await manager.health_check())["healthy"],
                       "info": await manager.get_sandbox_info(sid)}
            else:
                out = {"deleted": await manager.delete_sandbox(sid),
                       "info": await manager.get_sandbox_info(sid)}
            print(json.dumps(out, default=str), flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def deployed(namespace: str, server_image: str) -> Iterator[Deployed]:
    """The server applied from the manifests with one replica, ready."""
    with deploy(namespace, 1, [secrets.token_urlsafe(24)]) as server:
        yield server


class Client:
    """ms-enclave's HttpSandboxManager in its own process, one step at a time."""

    def __init__(self, python: Path, url: str, key: str) -> None:
        self.proc = subprocess.Popen(
            [str(python), "-c", CLIENT, url, key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def step(self, name: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            raise AssertionError(f"the client ended: {self.proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def _sandbox_pods(kube: Any, namespace: str) -> list[str]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector="kernel-sandbox=true").items
    return [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]


async def _none_left(kube: Any, namespace: str) -> bool:
    return not kube.core.list_namespaced_pod(namespace, label_selector="kernel-sandbox=true").items


def test_the_in_cluster_server_answers_ms_enclaves_client(
    kube: Any, namespace: str, deployed: Deployed, enclave_python: Path
) -> None:
    import asyncio

    url, key = deployed.url, deployed.keys[0]
    assert _sandbox_pods(kube, namespace) == []
    client = Client(enclave_python, url, key)
    try:
        made = client.step("create")
        assert (made["health"], made["status"], made["set"]) == (True, "running", "success")
        # the sandbox is a pod beside the server's, made with the ServiceAccount's rights
        (pod,) = _sandbox_pods(kube, namespace)
        spec = kube.core.read_namespaced_pod(pod, namespace).spec
        assert spec.containers[0].image == "kernel-sandbox:python"
        assert spec.automount_service_account_token is False

        used = client.step("use")  # state persists across python_executor calls
        assert (used["status"], used["output"].strip()) == ("success", "42")
        assert "ZeroDivisionError" in used["error"]
        assert made["sid"] in used["listed"]

        gone = client.step("delete")
        assert (gone["deleted"], gone["info"]) == (True, None)
        asyncio.run(await_for(lambda: _none_left(kube, namespace), timeout=120, interval=0.2))
    finally:
        client.close()


def test_a_killed_server_is_started_again_and_adopts_what_it_left(
    kube: Any, namespace: str, deployed: Deployed, enclave_python: Path
) -> None:
    import asyncio

    require(local_cluster(), "killing the server process needs the node: a local cluster")
    url, key = deployed.url, deployed.keys[0]
    client = Client(enclave_python, url, key)
    try:
        made = client.step("create")  # x = 20 in the sandbox's kernel
        assert made["status"] == "running"
        (pod,) = _sandbox_pods(kube, namespace)
        (server,) = deployed.urls
        os.kill(server_pid(server), signal.SIGKILL)  # no clean-up
        # the kubelet starts the container again in the same pod (same IP and port)
        ready_replicas(deployed, 1, restarts=1)
        assert deployed.urls == {server: url}
        # the new process serves it from the shared volume's state file, on demand: the
        # same pod, not a new one
        assert _sandbox_pods(kube, namespace) == [pod]
        # (first a step that does not raise: the client's pooled connection died with
        # the old process, and aiohttp drops it on the first call; the tool call after
        # would otherwise fail on it)
        after = client.step("health")
        assert after["health"] is True and made["sid"] in after["info"], after
        used = client.step("use")  # the same client, the server's new process, same kernel
        assert (used["status"], used["output"].strip()) == ("success", "42"), used
        assert made["sid"] in used["listed"]
        gone = client.step("delete")
        assert (gone["deleted"], gone["info"]) == (True, None)
        asyncio.run(await_for(lambda: _none_left(kube, namespace), timeout=120, interval=0.2))
        for kind in ("secret", "networkpolicy"):
            left = subprocess.run(
                [KUBECTL, "get", kind, "-n", namespace, "-l", "kernel-sandbox=true", "-o", "name"],
                capture_output=True,
                text=True,
            )
            assert (left.returncode, left.stdout) == (0, ""), left.stderr
    finally:
        client.close()


def test_the_docs_ms_enclave_program_runs_against_it(
    deployed: Deployed, enclave_python: Path
) -> None:
    """The ms-enclave program of the docs' Kubernetes page, with the test server's URL and key."""
    section = (ROOT / "docs" / "how-to" / "kubernetes.md").read_text()
    program = section.split("```python\nimport asyncio\n")[1].split("```")[0]
    url, key = deployed.url, deployed.keys[0]
    program = "import asyncio\n" + program.replace('"http://127.0.0.1:8000"', repr(url))
    program = program.replace('"<the key in kernel-sandbox-api-key>"', repr(key))
    assert repr(url) in program and repr(key) in program
    done = subprocess.run(
        [str(enclave_python), "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["42"]
