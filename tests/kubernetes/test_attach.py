"""KubernetesHost.attach on a real cluster: a sandbox pod whose owner process was
SIGKILLed is adopted with its kernel as it was (the path ``serve --on-restart adopt``
takes), a guest beside a live owner touches nothing, and a pod that is gone or does not
run is refused clearly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from kernel_sandbox.backends.kubernetes import KubernetesHost, manifests
from kernel_sandbox.backends.kubernetes.policy import local_address_towards
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import (
    ContainerRemovedError,
    ContainerStoppedError,
    KernelError,
    SandboxError,
    SandboxNotFoundError,
)
from kernel_sandbox.kernel.connection import new_connection_info
from kernel_sandbox.sandbox import AsyncSandbox
from tests.conftest import TEST_LABEL
from tests.kubernetes.conftest import PYTHON_IMAGE, ROOT
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes

#: Opens a sandbox pod, sets a variable, writes a file, restarts the kernel once (so the
#: one running is the supervisor's kernel 2), sets another variable, prints the id and
#: the pod's name, then waits to be killed.
OWNER = f"""
import sys
from kernel_sandbox.sync import Sandbox
sb = Sandbox.create(host="kubernetes", image={PYTHON_IMAGE!r}, labels={TEST_LABEL!r},
                    env_vars={{"MARK": "kept"}})
sb.files.write("kept.txt", "files too")
sb.restart()
sb.run_python("secret = 41")
print(sb.id, sb.container_id, flush=True)
sys.stdin.read()
"""


def _orphan() -> tuple[str, str]:
    """Run :data:`OWNER`, SIGKILL it once its sandbox is up: (sandbox id, pod name)."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert owner.stdout is not None
    line = owner.stdout.readline().split()
    os.kill(owner.pid, signal.SIGKILL)  # no clean-up: the pod is left running
    owner.wait()
    assert len(line) == 2, f"the owner did not make its sandbox: {line}"
    return line[0], line[1]


async def _gc_finds() -> list[str]:
    """What ``kernel-sandbox gc`` would remove now (nothing is removed)."""
    return [leftover.what for leftover in await KubernetesHost.gc()]


async def _gone(sandbox_id: str) -> bool:
    rows = await KubernetesHost.list_sandboxes({"kernel-sandbox.id": sandbox_id})
    return not rows


async def test_adopted_after_owner_sigkill_keeps_kernel_and_files(kube: Any, namespace) -> None:
    sandbox_id, pod = await asyncio.to_thread(_orphan)
    orphan = f"pod {namespace}/{pod}"
    assert orphan in await _gc_finds()  # its owner is gone
    sb = await AsyncSandbox.adopt(sandbox_id, host="kubernetes", labels=TEST_LABEL, interrupt=True)
    try:
        assert sb.container_id == pod
        # relabelled as the adopter's: gc here no longer takes it for an orphan
        labels = kube.core.read_namespaced_pod(pod, namespace).metadata.labels
        assert labels["kernel-sandbox.owner-pid"] == str(os.getpid())
        assert orphan not in await _gc_finds()
        # the settings the pod was made with, read back from the API
        assert (sb.config.transport, sb.config.image) == ("tcp", PYTHON_IMAGE)
        assert sb.config.env_vars == {"MARK": "kept"}
        assert sb.connection_info is not None
        pod_ip = kube.core.read_namespaced_pod(pod, namespace).status.pod_ip
        assert sb.connection_info["ip"] == pod_ip
        result = await sb.run_python("secret += 1; secret")
        assert result.status == "ok" and result.text == "42"  # the same kernel
        assert await sb.files.read_text("kept.txt") == "files too"
        # the policy now admits the adopter
        policy = kube.networking.read_namespaced_network_policy(pod, namespace)
        (rule,) = policy.spec.ingress
        cidr = f"{local_address_towards(sb.connection_info['ip'])}/32"
        assert [p.ip_block.cidr for p in rule._from] == [cidr]
        # the adopter restarts it in place (kernels counted on from the owner's: a wrong
        # count would hang the supervisor and fall back to a new pod, losing the file)
        await sb.restart()
        assert (await sb.run_python("'secret' in dir()")).text == "False"
        assert sb.container_id == pod
        assert await sb.files.read_text("kept.txt") == "files too"
        await sb.restart()  # and again
        assert (await sb.run_python("1 + 1")).text == "2"
    finally:
        await sb.close()
    await await_for(lambda: _gone(sandbox_id), timeout=60, interval=0.2)  # the adopter owned it


async def test_a_guest_beside_a_live_owner_touches_nothing(make_sandbox) -> None:
    owner = await make_sandbox()
    await owner.run_python("secret = 41")
    guest = await AsyncSandbox.adopt(owner.id, host="kubernetes", own=False)
    try:
        assert (await guest.run_python("secret")).text == "41"
        with pytest.raises(KernelError, match="guest"):
            await guest.restart()
    finally:
        await guest.close()
    rows = await KubernetesHost.list_sandboxes({"kernel-sandbox.id": owner.id})
    assert [r.running for r in rows] == [True]  # the guest left it running
    assert (await owner.run_python("secret + 1")).text == "42"


async def test_attach_refuses_a_deleted_pod(make_host, kube, namespace) -> None:
    host = await make_host("gone")
    (record,) = await KubernetesHost.list_sandboxes({"kernel-sandbox.id": host.sandbox_id})
    kube.core.delete_namespaced_pod(host.resource_id, namespace, grace_period_seconds=0)
    other = KubernetesHost(host.sandbox_id, SandboxConfig(), namespace=namespace)
    with pytest.raises(ContainerRemovedError, match="deleted from outside"):
        await other.attach(record)
    assert other.resource_id is None  # nothing taken over
    await await_for(lambda: _gone(host.sandbox_id), timeout=60, interval=0.2)
    with pytest.raises(SandboxNotFoundError):
        await AsyncSandbox.adopt(host.sandbox_id, host="kubernetes")


async def test_attach_refuses_a_pod_that_does_not_run(kube, namespace) -> None:
    """A pod whose image the node does not have waits forever: no kernel to attach to."""
    sandbox_id = f"norun{os.getpid() % 10000}"
    name = manifests.resource_name(sandbox_id)
    config = SandboxConfig(labels=TEST_LABEL)
    labels = manifests.kube_labels(
        {**TEST_LABEL, "kernel-sandbox": "true", "kernel-sandbox.id": sandbox_id}
    )
    info = new_connection_info("tcp", "0.0.0.0", list(manifests.KERNEL_PORTS))
    pod = manifests.pod_manifest(
        name, labels, info, config, image="kernel-sandbox:absent", image_pull_policy="Never"
    )
    kube.core.create_namespaced_pod(namespace, pod)
    try:
        (record,) = await KubernetesHost.list_sandboxes({"kernel-sandbox.id": sandbox_id})
        assert not record.running
        host = KubernetesHost(sandbox_id, config, namespace=namespace)
        with pytest.raises(ContainerStoppedError, match="does not run") as refused:
            await host.attach(record)
        assert isinstance(refused.value, SandboxError)
        with pytest.raises(SandboxNotFoundError):
            await AsyncSandbox.adopt(sandbox_id, host="kubernetes")
    finally:
        kube.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        await await_for(lambda: _gone(sandbox_id), timeout=60, interval=0.2)
