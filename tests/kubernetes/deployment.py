"""The in-cluster server as the manifests deploy it, for the Kubernetes tier's server tests.

:func:`deploy` applies ``deploy/kubernetes`` (or, on a cluster whose API server is on the
node's loopback, such as scripts/k8s/cluster.sh, the ``kubernetes-local`` overlay, as its
README says) into the session's namespace with a given number of replicas and API keys,
waits until every replica is ready, and removes everything afterwards: what it applied,
the sandboxes the replicas left (replicas never remove them when they stop), the reaper's
Lease and the shared volume's directory on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from kernel_sandbox.backends.kubernetes.api import kube as _kube
from tests.kubernetes.conftest import ROOT, SERVER_IMAGE
from tests.kubernetes.conftest import cluster_running as local_cluster
from tests.kubernetes.test_deploy import KUBECTL
from tests.waiting import await_for

__all__ = [
    "APP",
    "DEPLOY",
    "SERVER_IMAGE",
    "Deployed",
    "deploy",
    "local_cluster",
    "scale",
    "server_pid",
]

DEPLOY = ROOT / "deploy" / "kubernetes"
APP = "app.kubernetes.io/name=kernel-sandbox-server"
#: The local cluster's directory for shared volumes (scripts/k8s/cluster.sh: $RUN/shared).
SHARED_ROOT = Path(os.environ.get("K8S_BASE", "/tmp/kernel-sandbox-k8s")) / "run" / "shared"
#: Where the replicas' logs are kept when a deployment is taken down.
LOGS = SHARED_ROOT.parent.parent / "logs"


@dataclass
class Deployed:
    """A deployed server: its replicas' URLs (by pod name) and the API keys."""

    namespace: str
    keys: list[str]
    urls: dict[str, str]
    #: The node's directory of the shared volume (a local cluster), else None.
    shared: Path | None

    @property
    def url(self) -> str:
        return next(iter(self.urls.values()))


def _rendered(
    kube: Any, namespace: str, replicas: int, shared: Path | None, args: list[str]
) -> list[dict[str, Any]]:
    """The manifests as applied here: in ``namespace``, for this cluster, the server's
    command given ``args`` more."""
    api = urlsplit(kube.configuration.host)
    loopback = api.hostname in ("127.0.0.1", "localhost", "::1")
    source = DEPLOY.parent / "kubernetes-local" if loopback else DEPLOY
    done = subprocess.run([KUBECTL, "kustomize", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] != "Namespace"]
    volume = f"kernel-sandbox-shared-{namespace}"  # a PersistentVolume is the cluster's
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        if doc["kind"] == "PersistentVolume":
            doc["metadata"]["name"] = volume
            doc["metadata"].pop("namespace")
            assert shared is not None
            doc["spec"]["hostPath"]["path"] = str(shared)
        elif doc["kind"] == "PersistentVolumeClaim" and "volumeName" in doc["spec"]:
            doc["spec"]["volumeName"] = volume
        elif doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = replicas
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["command"] += args
            # what each replica did, for a failure's post-mortem (_keep_logs)
            container.setdefault("env", []).append(
                {"name": "KERNEL_SANDBOX_LOG_LEVEL", "value": "info"}
            )
    return docs


def _ready(kube: Any, namespace: str, replicas: int, restarts: int) -> dict[str, str]:
    """The replicas' URLs once ``replicas`` pods pass their readiness probe (or why not),
    their containers started again at least ``restarts`` times in all."""

    async def ready() -> dict[str, str] | None:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=APP).items
        urls, started = {}, 0
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                continue
            conditions = {c.type: c.status for c in pod.status.conditions or []}
            started += sum(s.restart_count for s in pod.status.container_statuses or [])
            if conditions.get("Ready") == "True" and pod.status.pod_ip:
                port = pod.spec.containers[0].ports[0].container_port
                urls[pod.metadata.name] = f"http://{pod.status.pod_ip}:{port}"
        return urls if len(urls) == replicas and started >= restarts else None

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
        raise AssertionError(f"the server pods are not ready: {states}\n{logs}") from None


def ready_replicas(deployed: Deployed, replicas: int, restarts: int = 0) -> None:
    """Wait for ``replicas`` ready pods again (after a kill, say); updates ``urls``."""
    deployed.urls = _ready(_kube(), deployed.namespace, replicas, restarts)


def scale(deployed: Deployed, replicas: int) -> None:
    """Scale the server's Deployment to ``replicas`` and wait until they are ready
    (bench/replicas.py: the same sandboxes through 1, 2, then 3 replicas)."""
    done = subprocess.run(
        [KUBECTL, "scale", "deployment/kernel-sandbox-server", "-n", deployed.namespace,
         f"--replicas={replicas}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ready_replicas(deployed, replicas)


@contextlib.contextmanager
def deploy(
    namespace: str, replicas: int, keys: list[str], args: tuple[str, ...] = ()
) -> Iterator[Deployed]:
    """The server applied from the manifests with ``replicas`` replicas, ready: the first
    of ``keys`` in the Secret the manifests name, the others as ``--api-key`` (so on the
    pod spec: tests only), and ``args`` more on the command."""
    kube = _kube()
    shared = None
    api = urlsplit(kube.configuration.host)
    if api.hostname in ("127.0.0.1", "localhost", "::1"):
        shared = SHARED_ROOT / namespace  # a hostPath is mounted as the node has it
        shared.mkdir(mode=0o700)
        os.chown(shared, 1000, 1000)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "kernel-sandbox-api-key", "namespace": namespace},
        "stringData": {"key": keys[0]},
    }
    more = [*args, *(a for key in keys[1:] for a in ("--api-key", key))]
    applied = yaml.safe_dump_all([secret, *_rendered(kube, namespace, replicas, shared, more)])
    done = subprocess.run(
        [KUBECTL, "apply", "-f", "-"], input=applied, capture_output=True, text=True
    )
    try:
        assert done.returncode == 0, done.stderr
        yield Deployed(namespace, keys, _ready(kube, namespace, replicas, 0), shared)
    finally:
        _keep_logs(namespace)
        subprocess.run(
            [KUBECTL, "delete", "--ignore-not-found", "--wait=true", "-f", "-"],
            input=applied,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        # replicas only let go of their sandboxes when they stop: remove what is left
        for kind in ("pods", "secrets", "networkpolicies", "leases"):
            selector = "kernel-sandbox=true" if kind != "leases" else "app.kubernetes.io/part-of"
            subprocess.run(
                [KUBECTL, "delete", kind, "-n", namespace, "-l", selector, "--wait=true"],
                capture_output=True,
                timeout=300,
                check=False,
            )
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)


def _keep_logs(namespace: str) -> None:
    """The replicas' logs, kept for a failure's post-mortem (printed: a failing test
    shows what its fixture printed) and in ``LOGS/<namespace>.log``."""
    done = subprocess.run(
        [KUBECTL, "logs", "-n", namespace, "-l", APP, "--prefix", "--tail=-1",
         "--max-log-requests=10"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    said, kept = done.stdout + done.stderr, LOGS / f"{namespace}.log"
    LOGS.mkdir(parents=True, exist_ok=True)
    kept.write_text(said)
    print(f"\n[server logs: {kept}]\n{said[-4000:]}")


def server_pid(pod: str) -> int:
    """The node's pid of the server process in pod ``pod`` (a local cluster)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        server = any(a.endswith("kernel-sandbox") for a in argv[:2]) and "serve" in argv
        if server and f"HOSTNAME={pod}".encode() in env:
            found.append(int(entry))
    assert len(found) == 1, f"server processes of pod {pod}: {found}"
    return found[0]
