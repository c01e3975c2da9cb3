"""Fixtures for the Kubernetes tier: a real cluster, real pods, real kernels.

The cluster is, in this order: the one ``KUBECONFIG`` names; the local one
``scripts/k8s/cluster.sh`` runs already (``.ci/run`` starts it); or, when neither is
there, in CI (as root), one this session brings up and tears down itself.
Without any, the tier skips locally and fails in CI.

Every test session works in a namespace of its own (``ks-test-<pid>``), deleted at the
end with everything in it; a session-end check fails if sandbox pods were left behind.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_LABEL, require

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "k8s" / "cluster.sh"
PYTHON_IMAGE = "kernel-sandbox:python"
DATASCIENCE_IMAGE = "kernel-sandbox:datascience"
SERVER_IMAGE = "kernel-sandbox:server"


def cluster_running() -> bool:
    """Whether scripts/k8s/cluster.sh's local cluster runs (on this machine)."""
    return subprocess.run([str(CLUSTER), "status"], capture_output=True).returncode == 0


def _kubeconfig() -> tuple[str | None, bool]:
    """The kubeconfig to use, and whether this session started the cluster."""
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"], False
    path = subprocess.run(
        [str(CLUSTER), "kubeconfig"], capture_output=True, text=True
    ).stdout.strip()
    if cluster_running():
        return path, False
    # Only CI starts a cluster of its own here (.ci/run normally did already): on a shared
    # machine a test run must not start one behind its users' backs.
    if os.geteuid() != 0 or not os.environ.get("CI"):
        return None, False
    up = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True)
    if up.returncode != 0:
        return None, False
    return up.stdout.strip().splitlines()[-1], True


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """The kubeconfig path of a running cluster (see the module)."""
    path, started = _kubeconfig()
    require(
        path is not None, "no Kubernetes cluster: set KUBECONFIG or run scripts/k8s/cluster.sh up"
    )
    assert path is not None
    os.environ["KUBECONFIG"] = path
    from kernel_sandbox.backends.kubernetes import api

    api.kube.cache_clear()
    try:
        api.kube().core.list_namespace(_request_timeout=10)
    except Exception as exc:
        require(False, f"the Kubernetes cluster does not answer: {exc}")
    yield path
    if started:
        subprocess.run([str(CLUSTER), "down"], check=False)


@pytest.fixture(scope="session")
def namespace(cluster: str) -> Iterator[str]:
    """A namespace for this session; deleted (with everything in it) at the end."""
    from kernel_sandbox.backends.kubernetes.api import kube

    name = f"ks-test-{os.getpid()}"
    core = kube().core
    core.create_namespace({"metadata": {"name": name, "labels": TEST_LABEL}})
    previous = os.environ.get("KERNEL_SANDBOX_NAMESPACE")
    os.environ["KERNEL_SANDBOX_NAMESPACE"] = name
    yield name
    pods = core.list_namespaced_pod(name, label_selector="kernel-sandbox=true").items
    left = [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]
    core.delete_namespace(name, grace_period_seconds=0)
    if previous is None:
        os.environ.pop("KERNEL_SANDBOX_NAMESPACE", None)
    else:
        os.environ["KERNEL_SANDBOX_NAMESPACE"] = previous
    assert not left, f"tests left sandbox pods behind: {left}"


@pytest.fixture
def kube(namespace: str) -> Any:
    """The process's Kubernetes API client (``.core``, ``.networking``)."""
    from kernel_sandbox.backends.kubernetes.api import kube as _kube

    return _kube()


@pytest.fixture
async def make_host(namespace: str) -> AsyncIterator[Any]:
    """Factory of launched :class:`KubernetesHost` objects; all cleaned up after the test."""
    from kernel_sandbox.backends.kubernetes import KubernetesHost
    from kernel_sandbox.config import SandboxConfig

    made: list[Any] = []

    async def _make(sandbox_id: str, launch: bool = True, **overrides: Any) -> Any:
        labels = {**TEST_LABEL, **overrides.pop("labels", {})}
        overrides.setdefault("image", PYTHON_IMAGE)
        config = SandboxConfig(labels=labels, **overrides)
        host = KubernetesHost(f"{sandbox_id}{os.getpid() % 10000}", config, namespace=namespace)
        made.append(host)
        if launch:
            host.info = await host.launch()
        return host

    yield _make
    await asyncio.gather(*(h.cleanup() for h in made), return_exceptions=True)


@pytest.fixture
async def make_sandbox(namespace: str) -> AsyncIterator[Any]:
    """Factory: ``await make_sandbox(**overrides)`` of sandboxes on the cluster."""
    from kernel_sandbox.sandbox import AsyncSandbox

    made: list[Any] = []

    async def _make(**overrides: Any) -> Any:
        labels = {**TEST_LABEL, **overrides.pop("labels", {})}
        overrides.setdefault("image", PYTHON_IMAGE)
        sandbox = await AsyncSandbox.create(host="kubernetes", labels=labels, **overrides)
        made.append(sandbox)
        return sandbox

    yield _make
    await asyncio.gather(*(s.close() for s in made), return_exceptions=True)


@pytest.fixture(scope="session")
def server_image(cluster: str) -> str:
    """kernel-sandbox:server, current with this source, in the cluster's image store.

    Built once (kept while the source is unchanged: the image carries its digest) and
    loaded into the local cluster's containerd (skipped when loaded already).  A cluster
    named by KUBECONFIG must have it already (docs/how-to/kubernetes.md).
    """
    from kernel_sandbox.backends.docker.images.builder import ImageBuilder

    ImageBuilder().build(["server"])
    if cluster_running():
        done = subprocess.run(
            [str(CLUSTER), "load", SERVER_IMAGE], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return SERVER_IMAGE
