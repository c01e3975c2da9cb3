"""The kubernetes host's pure parts: manifests from a config, pod states, exec statuses."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from kernel_sandbox.backends.kubernetes import manifests
from kernel_sandbox.backends.kubernetes.cluster import pod_state
from kernel_sandbox.backends.kubernetes.exec import _exit_code
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.kernel.connection import new_connection_info


def info():  # type: ignore[no-untyped-def]
    return new_connection_info("tcp", "0.0.0.0", list(manifests.KERNEL_PORTS))


def test_label_values_are_made_valid() -> None:
    labels = manifests.kube_labels({"a": "host name/with:bad*chars", "b": "x" * 80, "c": "-ok-"})
    assert labels["a"] == "host_name_with_bad_chars"
    assert len(labels["b"]) == 63
    assert labels["c"] == "ok"


@pytest.mark.parametrize(
    ("user", "ids"),
    [("sandbox", (1000, 1000)), ("1001", (1001, 1001)), ("1001:2002", (1001, 2002))],
)
def test_users_become_numeric_ids(user: str, ids: tuple[int, int]) -> None:
    assert manifests.sandbox_uid(SandboxConfig(user=user)) == ids


@pytest.mark.parametrize("user", ["root", "0", "nobody:staff"])
def test_users_a_pod_cannot_check_are_refused(user: str) -> None:
    with pytest.raises(ConfigError, match="user="):
        manifests.sandbox_uid(SandboxConfig(user=user))


def test_the_pod_never_carries_the_key_and_limits_everything() -> None:
    conn = info()
    cfg = SandboxConfig(memory_limit="2g", cpu_limit=1.5, disk_limit="1g", env_vars={"A": "b"})
    pod = manifests.pod_manifest("p", {"x": "y"}, conn, cfg, image="img")
    assert conn["key"] not in json.dumps(pod)
    secret = manifests.secret_manifest("p", {}, conn, cfg)
    assert conn["key"] in secret["stringData"]["KERNEL_SANDBOX_CONNECTION"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {
        "cpu": "1500m",
        "memory": f"{2 * 1024**2}Ki",
        "ephemeral-storage": "64Mi",
    }
    assert {"name": "A", "value": "b"} in container["env"]
    sizes = {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["spec"]["volumes"]}
    assert sizes == {"workdir": "524288Ki", "home": "262144Ki", "tmp": "196608Ki", "shm": "65536Ki"}


def test_the_policy_admits_labelled_client_pods_or_an_address() -> None:
    cfg = SandboxConfig()
    by_labels = manifests.network_policy_manifest(
        "p", "abc", {}, cfg, client_pod_labels={"app": "server"}
    )["spec"]
    assert by_labels["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"app": "server"}}}]
    assert by_labels["egress"] == []
    by_ip = manifests.network_policy_manifest("p", "abc", {}, cfg, client_cidr="10.0.0.5/32")
    assert by_ip["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.5/32"}}]
    nobody = manifests.network_policy_manifest(
        "p", "abc", {}, cfg.with_overrides(network_enabled=True)
    )["spec"]
    assert nobody["ingress"] == [] and nobody["egress"] == [{}]


def _pod(**status: object) -> k8s.V1Pod:
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p"), status=k8s.V1PodStatus(**status))


def test_pod_states_in_words() -> None:
    evicted = pod_state(
        _pod(
            phase="Failed",
            reason="Evicted",
            message="Pod ephemeral local storage usage exceeds the total limit",
        )
    )
    assert "evicted" in evicted.death_reason() and "ephemeral" in evicted.death_reason()
    oom = pod_state(
        _pod(
            phase="Failed",
            container_statuses=[
                k8s.V1ContainerStatus(
                    name="kernel",
                    image="i",
                    image_id="",
                    ready=False,
                    restart_count=0,
                    state=k8s.V1ContainerState(
                        terminated=k8s.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled")
                    ),
                )
            ],
        )
    )
    assert "out of memory" in oom.death_reason()
    deleted = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", deletion_timestamp="2026-01-01"),
        status=k8s.V1PodStatus(phase="Running"),
    )
    assert "deleted from outside" in pod_state(deleted).death_reason()


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b'{"metadata":{},"status":"Success"}', 0),
        (
            b'{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":'
            b'[{"reason":"ExitCode","message":"3"}]}}',
            3,
        ),
        (b"not json", -1),
        (  # a long command line echoed in the message, the middle cut by the cap
            b'{"status":"Failure","message":"command terminated [sh -c exit 3 xxx\n'
            b'[... 99 bytes cut ...]\nxx], exit code 3","reason":"NonZeroExitCode",'
            b'"details":{"causes":[{"reason":"ExitCode","message":"3"}]}}',
            3,
        ),
        (  # a cut one whose end the command tried to forge: its quotes are escaped
            b'{"status":"Failure","message":"x \\"causes\\":[{\\"reason\\":'
            b'\\"ExitCode\\",\\"message\\":\\"7\\"}]}}',
            -1,
        ),
    ],
)
def test_exit_codes_from_the_status_channel(status: bytes, code: int) -> None:
    assert _exit_code(status) == code
