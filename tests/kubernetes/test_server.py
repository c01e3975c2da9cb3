"""The in-cluster server: deploy/kubernetes applied, ``kernel-sandbox serve`` running in a
pod with the ServiceAccount's credentials, answering ms-enclave's own client.

The manifests go into the session's namespace.  On a cluster whose API server is on the
node's loopback (scripts/k8s/cluster.sh) the ``host-network`` overlay is applied, as its
README says; elsewhere the normal manifests.  ms-enclave's ``HttpSandboxManager`` runs in
its own virtualenv (the ``enclave_python`` fixture) in three separate processes, so the
state that persists is the server's, not a client's.

One deployment serves the module: the client's test, then a server killed with SIGKILL
(what an OOM kill does) whose container the kubelet starts again in the same pod: the
new process finds the sandbox pod the killed one left, by its server label on the
cluster, and adopts it (``--on-restart adopt``, the default): the same pod and kernel,
its variables kept, so ms-enclave's client goes on with it as if nothing happened.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import require
from tests.kubernetes.conftest import CLUSTER, ROOT
from tests.kubernetes.test_deploy import KUBECTL
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes

DEPLOY = ROOT / "deploy" / "kubernetes"
SERVER_IMAGE = "kernel-sandbox:server"
APP = "app.kubernetes.io/name=kernel-sandbox-server"

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


def _local_cluster() -> bool:
    return subprocess.run([str(CLUSTER), "status"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def server_image(cluster: str) -> str:
    """kernel-sandbox:server, current with this source, in the cluster's image store.

    Built once (kept while the source is unchanged: the image carries its digest) and
    loaded into the local cluster's containerd (skipped when loaded already).  A cluster
    named by KUBECONFIG must have it already (docs/how-to/kubernetes.md).
    """
    from kernel_sandbox.backends.docker.images.builder import ImageBuilder

    ImageBuilder().build(["server"])
    if _local_cluster():
        done = subprocess.run(
            [str(CLUSTER), "load", SERVER_IMAGE], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return SERVER_IMAGE


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def _rendered(kube: Any, namespace: str) -> list[dict[str, Any]]:
    """The manifests as applied here: in ``namespace``, and for this cluster's network."""
    api = urlsplit(kube.configuration.host)
    loopback = api.hostname in ("127.0.0.1", "localhost", "::1")
    source = DEPLOY.parent / "kubernetes-host-network" if loopback else DEPLOY
    done = subprocess.run([KUBECTL, "kustomize", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] != "Namespace"]
    port = _free_port() if loopback else 8000  # the node's port on a shared machine
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        if doc["kind"] != "Deployment":
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        command[command.index("--port") + 1] = str(port)
        container["ports"][0]["containerPort"] = port
        for env in container["env"]:
            if env["name"] == "KUBERNETES_SERVICE_PORT":
                env["value"] = str(api.port or 443)  # the overlay names the harness's port
    return docs


@pytest.fixture(scope="module")
def deployed(
    namespace: str, server_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """The server applied from the manifests and ready: (its URL, an API key).

    Everything applied is deleted afterwards (the namespace is the session's: other
    tests apply the same ServiceAccount and Role there)."""
    from kernel_sandbox.backends.kubernetes.api import kube as _kube

    kube = _kube()
    key = secrets.token_urlsafe(24)
    applied = tmp_path_factory.mktemp("server") / "applied.yaml"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "kernel-sandbox-api-key", "namespace": namespace},
        "stringData": {"key": key},
    }
    applied.write_text(yaml.safe_dump_all([secret, *_rendered(kube, namespace)]))
    done = subprocess.run([KUBECTL, "apply", "-f", str(applied)], capture_output=True, text=True)
    try:
        assert done.returncode == 0, done.stderr
        yield _ready_server(kube, namespace), key
    finally:  # the server ends gracefully (SIGTERM): it removes its sandboxes
        subprocess.run(
            [KUBECTL, "delete", "--ignore-not-found", "--wait=true", "-f", str(applied)],
            capture_output=True,
            timeout=300,
            check=False,
        )


def _ready_server(kube: Any, namespace: str, restarts: int = 0) -> str:
    """The URL of the server pod once its readiness probe passes (or why it did not),
    its container started again at least ``restarts`` times."""
    import asyncio

    async def ready() -> str | None:
        for pod in kube.core.list_namespaced_pod(namespace, label_selector=APP).items:
            conditions = {c.type: c.status for c in pod.status.conditions or []}
            started = sum(s.restart_count for s in pod.status.container_statuses or [])
            if conditions.get("Ready") == "True" and pod.status.pod_ip and started >= restarts:
                port = pod.spec.containers[0].ports[0].container_port
                return f"http://{pod.status.pod_ip}:{port}"
        return None

    try:
        return asyncio.run(await_for(ready, timeout=180, interval=1))
    except AssertionError:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=APP).items
        logs = [
            kube.core.read_namespaced_pod_log(p.metadata.name, namespace, tail_lines=40)
            for p in pods
            if p.status.phase != "Pending"
        ]
        states = [p.status.container_statuses for p in pods]
        raise AssertionError(f"the server pod is not ready: {states}\n{logs}") from None


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
    kube: Any, namespace: str, deployed: tuple[str, str], enclave_python: Path
) -> None:
    import asyncio

    url, key = deployed
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


def _server_pid(port: int) -> int:
    """The node's pid of the server process listening on ``port`` (a local cluster)."""
    wanted = ["serve", "--host", "0.0.0.0", "--port", str(port)]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if any(a.endswith("kernel-sandbox") for a in argv[:2]) and all(w in argv for w in wanted):
            found.append(int(entry))
    assert len(found) == 1, f"server processes on port {port}: {found}"
    return found[0]


def test_a_killed_server_is_started_again_and_adopts_what_it_left(
    kube: Any, namespace: str, deployed: tuple[str, str], enclave_python: Path
) -> None:
    import asyncio

    require(_local_cluster(), "killing the server process needs the node: a local cluster")
    url, key = deployed
    client = Client(enclave_python, url, key)
    try:
        made = client.step("create")  # x = 20 in the sandbox's kernel
        assert made["status"] == "running"
        (pod,) = _sandbox_pods(kube, namespace)
        os.kill(_server_pid(int(urlsplit(url).port or 0)), signal.SIGKILL)  # no clean-up
        # the kubelet starts the container again in the same pod (same /tmp, same port)
        assert _ready_server(kube, namespace, restarts=1) == url
        (server,) = kube.core.list_namespaced_pod(namespace, label_selector=APP).items
        logs = kube.core.read_namespaced_pod_log(server.metadata.name, namespace)
        # its notebook survived in the pod's /tmp: the sandbox pod was adopted, not removed
        assert "adopted 1 sandboxes a previous run left" in logs, logs[-3000:]
        assert "removed 1 sandboxes" not in logs, logs[-3000:]
        assert _sandbox_pods(kube, namespace) == [pod]
        # (first a step that does not raise: the client's pooled connection died with
        # the old process, and aiohttp drops it on the first call; the tool call after
        # would otherwise fail on it)
        after = client.step("health")
        assert after["health"] is True and made["sid"] in after["info"], after
        assert "adopted after a server restart" in after["info"], after
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
    deployed: tuple[str, str], enclave_python: Path
) -> None:
    """The ms-enclave program of the docs' Kubernetes page, with the test server's URL and key."""
    section = (ROOT / "docs" / "how-to" / "kubernetes.md").read_text()
    program = section.split("```python\nimport asyncio\n")[1].split("```")[0]
    url, key = deployed
    program = "import asyncio\n" + program.replace('"http://127.0.0.1:8000"', repr(url))
    program = program.replace('"<the key in kernel-sandbox-api-key>"', repr(key))
    assert repr(url) in program and repr(key) in program
    done = subprocess.run(
        [str(enclave_python), "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["42"]
