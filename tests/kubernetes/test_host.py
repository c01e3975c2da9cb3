"""KubernetesHost on a real cluster: the objects it makes, exec and files within their
caps, and the errors users hit (missing image, quota, deleted pod, dead API server)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import zmq
from kubernetes.utils import parse_quantity

from kernel_sandbox.backends.base import ExecResult
from kernel_sandbox.backends.kubernetes import KubernetesHost, api, manifests
from kernel_sandbox.backends.kubernetes import exec as pod_exec
from kernel_sandbox.backends.kubernetes import host as pod_host
from kernel_sandbox.backends.kubernetes.policy import local_address_towards
from kernel_sandbox.config import TCP_STATE_DIR, SandboxConfig
from kernel_sandbox.errors import (
    ContainerRemovedError,
    EngineUnavailableError,
    FileOperationError,
    ImageNotFoundError,
    SandboxFileNotFoundError,
    SandboxStartError,
)
from kernel_sandbox.kernel.client import KernelSession
from kernel_sandbox.kernel.supervisor import STATUS_FILE
from kernel_sandbox.limits import K8S_EXEC_STATUS_BYTES, K8S_STATUS_READ_BYTES
from tests.conftest import TEST_LABEL
from tests.kubernetes.conftest import ROOT
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes


async def test_pod_spec_read_back_has_the_safe_defaults(make_host, kube, namespace) -> None:
    host = await make_host("spec", cpu_limit=0.5, memory_limit="768m", disk_limit="64m")
    pod = kube.core.read_namespaced_pod(host.resource_id, namespace)
    spec = pod.spec
    assert spec.automount_service_account_token is False
    assert spec.enable_service_links is False
    assert spec.restart_policy == "Never"
    assert spec.security_context.run_as_non_root is True
    assert spec.security_context.run_as_user == 1000
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    (container,) = spec.containers
    ctx = container.security_context
    assert ctx.run_as_non_root is True and ctx.run_as_user == 1000
    assert ctx.allow_privilege_escalation is False
    assert ctx.privileged is False
    assert ctx.read_only_root_filesystem is True
    assert ctx.capabilities.drop == ["ALL"] and not ctx.capabilities.add
    assert ctx.seccomp_profile.type == "RuntimeDefault"
    limits = container.resources.limits
    assert parse_quantity(limits["cpu"]) == parse_quantity("0.5")
    assert parse_quantity(limits["memory"]) == 768 * 1024**2
    assert parse_quantity(limits["ephemeral-storage"]) == parse_quantity(
        manifests.EPHEMERAL_STORAGE
    )
    # every writable place is a memory emptyDir with its share of disk_limit
    volumes = {v.name: v for v in spec.volumes}
    mounts = {m.mount_path: m.name for m in container.volume_mounts}
    assert set(mounts) == {"/sandbox", "/home/sandbox", "/tmp", "/dev/shm"}
    budget = host.config.disk_budget()
    for place, share in (("workdir", "working_dir"), ("home", "home"), ("tmp", "tmp")):
        empty = volumes[place].empty_dir
        assert empty.medium == "Memory"
        assert parse_quantity(empty.size_limit) == budget[share] // 1024 * 1024
    # the HMAC key is in the Secret, never in the pod spec
    key = host.info["key"]
    assert key not in json.dumps(kube.client.sanitize_for_serialization(pod))
    assert container.env_from[0].secret_ref.name == host.resource_id
    secret = kube.core.read_namespaced_secret(host.resource_id, namespace)
    assert secret.data and "KERNEL_SANDBOX_CONNECTION" in secret.data
    # labels for ownership; the Secret and the policy belong to the pod
    labels = pod.metadata.labels
    assert labels["kernel-sandbox.id"] == host.sandbox_id
    assert labels["kernel-sandbox.owner-pid"] == str(os.getpid())
    assert labels["kernel-sandbox.test"] == "1"
    policy = kube.networking.read_namespaced_network_policy(host.resource_id, namespace)
    for obj in (secret, policy):
        (owner,) = obj.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid) == ("Pod", pod.metadata.name, pod.metadata.uid)
    # and the kernel really runs as uid 1000 on a read-only root without capabilities
    result = await host.exec(
        ["sh", "-c", "id -u; grep CapEff /proc/self/status; touch /opt/x 2>&1; echo $?"]
    )
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "1000"
    assert lines[1].split()[1] == "0000000000000000"
    assert "Read-only file system" in lines[2] and lines[3] != "0"


async def test_network_policy_admits_only_the_client(make_host, kube, namespace) -> None:
    """The bridge CNI of the test cluster does not enforce policies: the objects are checked."""
    host = await make_host("netpol")
    policy = kube.networking.read_namespaced_network_policy(host.resource_id, namespace).spec
    assert policy.pod_selector.match_labels == {"kernel-sandbox.id": host.sandbox_id}
    assert sorted(policy.policy_types) == ["Egress", "Ingress"]
    assert not policy.egress  # no egress at all
    (rule,) = policy.ingress
    (peer,) = rule._from
    assert peer.ip_block.cidr == f"{local_address_towards(host.info['ip'])}/32"
    assert sorted(p.port for p in rule.ports) == sorted(manifests.KERNEL_PORTS)
    assert {p.protocol for p in rule.ports} == {"TCP"}
    # this cluster's bridge ignores the policy; the kernel's sockets still answer no one
    # without the key (CURVE, its secret key in the Secret): the heartbeat answers a keyed
    # peer, then a plain one gets nothing
    assert host.info.get("curve_publickey")
    ctx = zmq.Context.instance()
    keyed = ctx.socket(zmq.REQ)
    keyed.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.curve_keypair()
    keyed.curve_publickey, keyed.curve_secretkey = public, secret
    keyed.curve_serverkey = host.info["curve_publickey"].encode()
    keyed.connect(f"tcp://{host.info['ip']}:{host.info['hb_port']}")
    keyed.send(b"ping")
    assert keyed.poll(30000) and keyed.recv() == b"ping"
    keyed.close()
    plain = ctx.socket(zmq.REQ)
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(f"tcp://{host.info['ip']}:{host.info['hb_port']}")
    plain.send(b"ping")
    assert not plain.poll(2000), "a peer without the key got an answer"
    plain.close()
    opened = await make_host("netok", network_enabled=True)
    spec = kube.networking.read_namespaced_network_policy(opened.resource_id, namespace).spec
    assert len(spec.egress) == 1 and not spec.egress[0].to  # egress to anywhere


async def test_exec_runs_as_the_sandbox_user_within_its_cap(make_host) -> None:
    host = await make_host("exec")
    result = await host.exec(
        ["sh", "-c", "id -un; pwd; echo $A; echo oops >&2; exit 3"],
        workdir="/tmp",
        env={"A": "x y"},
    )
    assert result.exit_code == 3
    assert result.stdout.decode().split("\n")[:3] == ["sandbox", "/tmp", "x y"]
    assert result.stderr == b"oops\n"
    flood = await host.exec(["sh", "-c", "head -c 200000000 /dev/zero"], max_output_bytes=4096)
    assert flood.exit_code == 0
    assert len(flood.stdout) <= 4096 + 200
    assert flood.truncated_bytes >= 200_000_000 - 4096
    echo = await host.exec(["cat"], stdin=b"\x00binary\xffdata" * 1000)
    assert echo.stdout == b"\x00binary\xffdata" * 1000


async def test_a_long_commands_status_is_capped_and_still_tells_its_exit_code(
    make_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exec status document echoes the command line (300 KB of it here): the host
    keeps at most K8S_EXEC_STATUS_BYTES of it, and the exit code from its end."""
    host = await make_host("status")
    kept: list[int] = []
    told = pod_exec._exit_code

    def exit_code(status: bytes) -> int:
        kept.append(len(status))
        return told(status)

    monkeypatch.setattr(pod_exec, "_exit_code", exit_code)
    result = await host.exec(["sh", "-c", "exit 3", *["x" * 100_000] * 3])
    assert result.exit_code == 3
    assert kept[-1] <= K8S_EXEC_STATUS_BYTES + 200  # and the cut's marker line
    assert kept[-1] < 300_000  # the echo was cut


async def test_a_status_file_the_sandbox_floods_is_read_within_its_cap(
    make_sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's status file is the sandbox's: 8 MiB of junk in it costs each of
    the host's reads while a cell runs at most K8S_STATUS_READ_BYTES, and is no end."""
    sb = await make_sandbox()
    reads: list[int] = []
    run = sb.host.exec

    async def counted(argv: list[str], **kw: object) -> ExecResult:
        result: ExecResult = await run(argv, **kw)  # type: ignore[arg-type]
        if argv[-1] == pod_host._STATUS_READ:
            reads.append(len(result.stdout) + result.truncated_bytes)
        return result

    monkeypatch.setattr(sb.host, "exec", counted)
    status = f"{TCP_STATE_DIR}/{STATUS_FILE}"  # the supervisor's report of the kernel's end
    flood = (
        f"import os\nopen({status!r} + '.junk', 'wb').write(b'x' * (8 << 20))\n"
        f"os.replace({status!r} + '.junk', {status!r})\nprint(os.path.getsize({status!r}))"
    )
    flooded = await sb.run_python(flood)
    assert flooded.stdout.strip() == str(8 << 20), flooded.text
    ran = await sb.run_python("import time\ntime.sleep(3)\nprint('alive')")
    assert ran.status == "ok" and ran.stdout == "alive\n", ran.text
    assert reads and max(reads) <= K8S_STATUS_READ_BYTES, reads
    assert max(reads) < 8 << 20  # never the whole file


async def test_files_as_the_sandbox_user(make_sandbox) -> None:
    """The sandbox's file API over the exec API: as uid 1000, capped, never blocked."""
    sb = await make_sandbox(disk_limit="32m", max_file_bytes=10 * 1024 * 1024)
    payload = os.urandom(3 * 1024 * 1024)
    await sb.files.write("/sandbox/deep/dir/blob.bin", payload)
    assert await sb.files.read("/sandbox/deep/dir/blob.bin") == payload
    owner = await sb.run_shell("stat -c %u /sandbox/deep/dir/blob.bin")
    assert owner.stdout.strip() == "1000"
    with pytest.raises(SandboxFileNotFoundError):
        await sb.files.read("/sandbox/missing")
    with pytest.raises(FileOperationError, match="directory"):
        await sb.files.read("/sandbox/deep")
    await sb.run_shell("head -c 11000000 /dev/zero > /sandbox/big.bin")
    with pytest.raises(FileOperationError, match="max_file_bytes"):
        await sb.files.read("/sandbox/big.bin")
    await sb.run_shell("rm /sandbox/big.bin; mkfifo /tmp/fifo; ln -s /dev/zero /sandbox/zero")
    for planted in ("/tmp/fifo", "/sandbox/zero"):
        with pytest.raises(FileOperationError, match="not a regular file"):
            await asyncio.wait_for(sb.files.read(planted), 120)
    with pytest.raises(FileOperationError, match=r"[Pp]ermission"):
        await sb.files.read("/etc/shadow")
    with pytest.raises(FileOperationError, match=r"[Rr]ead-only"):
        await sb.files.write("/etc/evil", b"x")
    # a write past the working directory's share (16 MiB) is refused, and returns
    with pytest.raises(FileOperationError, match="no space left on device"):
        await asyncio.wait_for(sb.files.write("/sandbox/full.bin", b"x" * (20 * 1024 * 1024)), 120)


async def test_kernel_restart_in_place_keeps_files(make_host) -> None:
    host = await make_host("restart")
    session = KernelSession(host.info)
    await session.connect(60, host.poll)
    run = await session.execute(
        "x = 1\nopen('/sandbox/kept.txt', 'w').write('kept')",
        timeout=30,
        interrupt_grace=2,
        check_alive=host.poll,
        max_output_bytes=10_000,
    )
    assert run.outcome == "finished"
    session.close()
    info = await host.restart_kernel()
    session = KernelSession(info)
    await session.connect(60, host.poll)
    run = await session.execute(
        "print('x' in globals(), open('/sandbox/kept.txt').read())",
        timeout=30,
        interrupt_grace=2,
        check_alive=host.poll,
        max_output_bytes=10_000,
    )
    session.close()
    assert run.outputs[0]["text"] == "False kept\n"


async def test_missing_image_names_the_image(make_host) -> None:
    host = await make_host("noimg", launch=False, image="kernel-sandbox:no-such-tag")
    with pytest.raises(ImageNotFoundError) as caught:
        await host.launch()
    message = str(caught.value)
    assert "kernel-sandbox:no-such-tag" in message
    assert any(r in message for r in ("ImagePullBackOff", "ErrImagePull", "ErrImageNeverPull"))


async def _quota_enforced(kube, namespace) -> bool:
    """Whether the API server's admission refuses a pod over the new quota yet.

    Admission reads quotas from a cache, and remembers for 30 s that a namespace had
    none: a quota made a moment ago can let a pod through, so ask with a dry run first.
    """
    probe = {
        "metadata": {"generateName": "ks-quota-probe-"},
        "spec": {
            "containers": [
                {"name": "c", "image": "none", "resources": {"limits": {"memory": "1Gi"}}}
            ]
        },
    }
    try:
        await asyncio.to_thread(kube.core.create_namespaced_pod, namespace, probe, dry_run="All")
    except api.ApiException as exc:
        return exc.status == 403 and "exceeded quota" in api.message_of(exc)
    return False


async def test_quota_exceeded_is_a_clear_start_error(make_host, kube, namespace) -> None:
    quota = {
        "metadata": {"name": "ks-test-quota", "labels": TEST_LABEL},
        "spec": {"hard": {"limits.memory": "256Mi"}},
    }
    kube.core.create_namespaced_resource_quota(namespace, quota)
    try:
        await await_for(lambda: _quota_enforced(kube, namespace), timeout=60, interval=0.2)
        host = await make_host("quota", launch=False, memory_limit="1g")
        with pytest.raises(SandboxStartError, match=r"ResourceQuota.*memory_limit"):
            await host.launch()
    finally:
        kube.core.delete_namespaced_resource_quota("ks-test-quota", namespace)


async def test_pod_deleted_from_outside(make_host, kube, namespace) -> None:
    host = await make_host("deleted")
    kube.core.delete_namespaced_pod(host.resource_id, namespace, grace_period_seconds=0)

    async def reason() -> str | None:
        host._pod_read = 0.0  # no rate limit in the test: the next poll asks the API
        return await host.poll()

    why = await await_for(reason, timeout=60, interval=0.2)
    assert "deleted from outside" in why
    with pytest.raises(ContainerRemovedError, match="deleted from outside"):
        await host.exec(["true"])
    # the Secret and the policy go with their owner, by the cluster's garbage collector

    async def all_gone() -> bool:
        selector = f"kernel-sandbox.id={host.sandbox_id}"
        left = (
            kube.core.list_namespaced_secret(namespace, label_selector=selector).items
            + kube.networking.list_namespaced_network_policy(
                namespace, label_selector=selector
            ).items
            + kube.core.list_namespaced_pod(namespace, label_selector=selector).items
        )
        return not left

    await await_for(all_gone, timeout=90, interval=0.2)


def test_api_server_unreachable(monkeypatch, tmp_path, cluster) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        textwrap.dedent(
            """\
            apiVersion: v1
            kind: Config
            clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
            users: [{name: u, user: {token: x}}]
            contexts: [{name: c, context: {cluster: c, user: u}}]
            current-context: c
            """
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    api.kube.cache_clear()
    try:
        host = KubernetesHost("unreach", SandboxConfig(image="x"), namespace="default")
        with pytest.raises(
            EngineUnavailableError, match=r"Kubernetes API server at .*127\.0\.0\.1:9"
        ):
            asyncio.run(host.launch())
    finally:
        monkeypatch.setenv("KUBECONFIG", cluster)
        api.kube.cache_clear()


ORPHAN_MAKER = """
import asyncio, sys
from kernel_sandbox.backends.kubernetes import KubernetesHost
from kernel_sandbox.config import TCP_STATE_DIR, SandboxConfig
host = KubernetesHost(sys.argv[1], SandboxConfig(image="kernel-sandbox:python",
                      labels={"kernel-sandbox.test": "1"}))
asyncio.run(host.launch())
print("up", flush=True)
sys.stdin.read()
"""


async def test_gc_removes_what_a_killed_owner_left(namespace, kube) -> None:
    sandbox_id = f"orphan{os.getpid() % 10000}"
    maker = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_MAKER, sandbox_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert maker.stdout is not None
    assert maker.stdout.readline().strip() == "up"
    os.kill(maker.pid, signal.SIGKILL)
    maker.wait()
    leftovers = await KubernetesHost.gc()
    mine = [left for left in leftovers if sandbox_id in left.what]
    # the orphaned pod; its Secret and policy are young (a sandbox may be starting: gc
    # leaves them a minute) and go with the pod, whose they are (ownerReferences)
    assert [left.what.split()[0] for left in mine] == ["pod"]
    everything = [left for left in await KubernetesHost.gc(remove_all=True)]
    assert {left.what.split()[0] for left in everything if sandbox_id in left.what} == {
        "pod",
        "secret",
        "networkpolicy",
    }
    await mine[0].remove()
    selector = f"kernel-sandbox.id={sandbox_id}"

    async def gone() -> bool:
        return not (
            kube.core.list_namespaced_pod(namespace, label_selector=selector).items
            or kube.core.list_namespaced_secret(namespace, label_selector=selector).items
            or kube.networking.list_namespaced_network_policy(
                namespace, label_selector=selector
            ).items
        )

    await await_for(gone, timeout=90, interval=0.2)
    assert not [left for left in await KubernetesHost.gc() if sandbox_id in left.what]


async def test_an_evicted_pod_is_a_clear_error(make_host, kube, namespace) -> None:
    """Eviction through the API (what `kubectl drain` does to a node's pods)."""
    host = await make_host("evict")
    eviction = {
        "apiVersion": "policy/v1beta1",
        "kind": "Eviction",
        "metadata": {"name": host.resource_id, "namespace": namespace},
    }
    kube.core.create_namespaced_pod_eviction(host.resource_id, namespace, eviction)

    async def reason() -> str | None:
        host._pod_read = 0.0
        return await host.poll()

    why = await await_for(reason, timeout=60, interval=0.2)
    assert "evicted" in why and "create a new sandbox" in why
    with pytest.raises(ContainerRemovedError, match="evicted"):
        await host.restart_whole()
