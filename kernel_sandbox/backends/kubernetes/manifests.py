"""The Kubernetes objects of one sandbox: its Pod, the Secret with its key, its NetworkPolicy.

Pure functions from a :class:`~kernel_sandbox.config.SandboxConfig` to plain manifests
(dicts the API accepts as they are), so the defaults can be read and tested without a
cluster.  They are Docker's defaults in Kubernetes terms:

- ``runAsNonRoot`` as uid 1000 (the images' ``sandbox`` user), no privilege escalation,
  every capability dropped, ``seccompProfile: RuntimeDefault``, a read-only root;
- the writable places (working directory, $HOME, /tmp, /dev/shm) are memory-backed
  ``emptyDir`` volumes with their share of ``disk_limit`` as ``sizeLimit``;
- CPU, memory and ephemeral-storage limits; no service-account token, no service links;
- the kernel's connection (its HMAC key) lives in a Secret the pod reads at start, never
  in the pod spec;
- a NetworkPolicy that denies all egress (unless ``network_enabled``) and admits ingress
  to the kernel's ports only from the client.  Policies are enforced only by a CNI that
  implements them (Calico, Cilium, ...); a plain bridge CNI stores and ignores them.

Only the stable core API is used (v1 Pods and Secrets, networking.k8s.io/v1), which
every supported Kubernetes version serves.
"""

from __future__ import annotations

import re
from typing import Any

from ...config import KERNEL_PYTHON, LABEL_PREFIX, SandboxConfig, parse_size
from ...errors import ConfigError
from ...kernel.connection import PORT_NAMES, ConnectionInfo, launch_command
from ...kernel.supervisor import TCP_STATE_DIR

__all__ = [
    "CONTAINER_NAME",
    "KERNEL_PORTS",
    "SANDBOX_UID",
    "kube_labels",
    "network_policy_manifest",
    "pod_manifest",
    "resource_name",
    "sandbox_uid",
    "secret_manifest",
]

#: The kernel's five ports inside its pod (each pod has its own network namespace).
KERNEL_PORTS = (50001, 50002, 50003, 50004, 50005)
#: The uid of the ``sandbox`` user in kernel-sandbox images.
SANDBOX_UID = 1000
CONTAINER_NAME = "kernel"
#: ephemeral-storage a sandbox may use outside its memory volumes (its container log).
EPHEMERAL_STORAGE = "64Mi"
#: What the scheduler reserves per sandbox; the limits are the config's.
CPU_REQUEST = 0.05
MEMORY_REQUEST = 64 * 1024**2

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def resource_name(sandbox_id: str) -> str:
    """The name of the pod, the Secret and the NetworkPolicy of a sandbox."""
    return f"kernel-sandbox-{sandbox_id}"


def kube_labels(labels: dict[str, str]) -> dict[str, str]:
    """Labels as Kubernetes accepts them: values of at most 63 characters of
    ``[A-Za-z0-9_.-]`` that start and end with a letter or digit."""
    out = {}
    for key, value in labels.items():
        clean = _LABEL_VALUE.sub("_", value)[:63].strip("_.-")
        out[key] = clean
    return out


def sandbox_uid(config: SandboxConfig) -> tuple[int, int]:
    """The numeric uid and gid the pod runs as.

    Kubernetes needs numbers (``runAsNonRoot`` cannot check a name): ``sandbox`` (the
    default) is uid 1000 in every kernel-sandbox image; other users must be given as
    ``uid`` or ``uid:gid``.
    """
    user, _, group = config.user.partition(":")
    if user == "sandbox" and not group:
        return SANDBOX_UID, SANDBOX_UID
    if not user.isdigit() or (group and not group.isdigit()):
        raise ConfigError(
            f"user={config.user!r}: on Kubernetes give the user as a number, 'uid' or "
            "'uid:gid' (the pod's runAsUser), or leave the default 'sandbox' (uid 1000)"
        )
    uid = int(user)
    if uid == 0:
        raise ConfigError("user=0: sandbox pods run as non-root (runAsNonRoot); pick a uid > 0")
    return uid, int(group) if group else uid


def secret_manifest(
    name: str, labels: dict[str, str], info: ConnectionInfo, config: SandboxConfig
) -> dict[str, Any]:
    """The Secret holding the kernel's launch environment (with its HMAC key)."""
    _, env = launch_command(KERNEL_PYTHON, info, TCP_STATE_DIR, config.kernel)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels},
        "type": "Opaque",
        "stringData": env,
    }


def _quantity(nbytes: int) -> str:
    return f"{max(nbytes // 1024, 1)}Ki"


def pod_manifest(
    name: str,
    labels: dict[str, str],
    info: ConnectionInfo,
    config: SandboxConfig,
    *,
    image: str,
    image_pull_policy: str = "IfNotPresent",
    service_account: str | None = None,
) -> dict[str, Any]:
    """The sandbox's pod: the supervisor and its kernel, locked down (see the module)."""
    uid, gid = sandbox_uid(config)
    command, _ = launch_command(KERNEL_PYTHON, info, TCP_STATE_DIR, config.kernel)
    memory = parse_size(config.memory_limit)
    budget = config.disk_budget()
    home = "/home/sandbox"
    places = {"workdir": config.working_dir, "home": home, "tmp": "/tmp", "shm": "/dev/shm"}
    shares = {"workdir": "working_dir", "home": "home", "tmp": "tmp", "shm": "shm"}
    volumes, mounts = [], []
    for vol, path in places.items():
        empty: dict[str, Any] = {"medium": "Memory"}
        if budget:
            empty["sizeLimit"] = _quantity(budget[shares[vol]])
        volumes.append({"name": vol, "emptyDir": empty})
        mounts.append({"name": vol, "mountPath": path})
    env = [{"name": k, "value": v} for k, v in config.env_vars.items()]
    env.append({"name": "HOME", "value": home})
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": command,
        "workingDir": config.working_dir,
        "env": env,
        "envFrom": [{"secretRef": {"name": name}}],
        "ports": [
            {"name": port_name.replace("_port", ""), "containerPort": port, "protocol": "TCP"}
            for port_name, port in zip(PORT_NAMES, KERNEL_PORTS, strict=True)
        ],
        "resources": {
            "limits": {
                "cpu": f"{int(config.cpu_limit * 1000)}m",
                "memory": _quantity(memory),
                "ephemeral-storage": EPHEMERAL_STORAGE,
            },
            "requests": {
                "cpu": f"{int(min(config.cpu_limit, CPU_REQUEST) * 1000)}m",
                "memory": _quantity(min(memory, MEMORY_REQUEST)),
                "ephemeral-storage": "1Mi",
            },
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
        "terminationMessagePolicy": "File",
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # 0 would drop the pod from the API before the kubelet has killed it
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def network_policy_manifest(
    name: str,
    sandbox_id: str,
    labels: dict[str, str],
    config: SandboxConfig,
    *,
    client_cidr: str | None = None,
    client_pod_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A policy for the sandbox's pod alone: ingress to the kernel's ports from the client
    only (an IP block, or pods with the client's labels), no egress unless
    ``network_enabled``."""
    peers: list[dict[str, Any]] = []
    if client_pod_labels:
        peers.append({"podSelector": {"matchLabels": client_pod_labels}})
    if client_cidr:
        peers.append({"ipBlock": {"cidr": client_cidr}})
    ingress = [
        {
            "from": peers,
            "ports": [{"protocol": "TCP", "port": port} for port in KERNEL_PORTS],
        }
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {f"{LABEL_PREFIX}.id": sandbox_id}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress if peers else [],
            "egress": [{}] if config.network_enabled else [],
        },
    }
