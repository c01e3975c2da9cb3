"""What another process needs to reach a running sandbox pod's kernel, read from the API.

A pod's labels carry ids only.  The kernel's connection (its HMAC key and CURVE keys,
ports, transport) is in the sandbox's Secret, which only a holder of the namespace's
Secret rights can read; the pod's IP, its image, user, working directory and
environment are in the pod; whether it may reach out is in its NetworkPolicy.  Secrets
and policies are read by listing one name (the Role of deploy/kubernetes grants
``list``, not ``get``, on them).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ContainerRemovedError, ContainerStoppedError, KernelError
from ...kernel.connection import ConnectionInfo
from ...kernel.supervisor import GO_PREFIX, TCP_STATE_DIR
from . import manifests
from .api import ApiException, Kube, api_call, removed_error
from .cluster import pod_state

if TYPE_CHECKING:
    from ...config import SandboxConfig

__all__ = ["KERNEL_NUMBER_READ", "Attached", "kernel_number", "read_sandbox"]

#: Lists the supervisor's ``go-<n>`` files (kernel n + 1 was let start), bounded: the
#: directory is in the pod's /tmp, which sandbox code can fill.
KERNEL_NUMBER_READ = (
    f"cd {TCP_STATE_DIR} 2>/dev/null || exit 0; "
    f'for f in {GO_PREFIX}*; do echo "$f"; done | head -c 65536'
)
_GENERATION = re.compile(r"-r(\d{1,9})")
_GO = re.compile(rf"^{re.escape(GO_PREFIX)}(\d{{1,9}})$")


@dataclass(frozen=True)
class Attached:
    """A running sandbox pod as the API describes it."""

    info: ConnectionInfo
    pod_uid: str
    generation: int
    config_updates: dict[str, Any]


async def read_sandbox(
    kube: Kube, namespace: str, pod_name: str, sandbox_id: str, config: SandboxConfig
) -> Attached:
    """The connection info (with the pod's IP) and settings of a running sandbox pod.

    Raises :class:`ContainerRemovedError` when the pod is gone or being deleted,
    :class:`ContainerStoppedError` when it does not run, :class:`KernelError` when its
    Secret is missing or holds no kernel connection.
    """
    try:
        pod = await api_call(
            "reading the sandbox's pod", kube.core.read_namespaced_pod, pod_name, namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            raise removed_error() from exc
        raise
    state = pod_state(pod)
    if state.removed:
        raise ContainerRemovedError(
            f"sandbox {sandbox_id} cannot be attached: {state.death_reason()}"
        )
    if not state.running or not pod.status.pod_ip:
        raise ContainerStoppedError(
            f"sandbox {sandbox_id}'s pod {namespace}/{pod_name} does not run "
            f"({state.death_reason()}); there is no kernel to attach to"
        )
    # the Secret and the policy are named as the pod (a whole restart makes all three anew)
    info = await _connection(kube, namespace, pod_name)
    policy = await _listed(kube.networking.list_namespaced_network_policy, namespace, pod_name)
    container = pod.spec.containers[0]
    updates: dict[str, Any] = {
        "transport": "tcp",
        "image": container.image,
        "working_dir": container.working_dir or config.working_dir,
        "env_vars": {e.name: e.value or "" for e in container.env or [] if e.name != "HOME"},
    }
    security = container.security_context
    if security is not None and security.run_as_user is not None:
        uid, gid = security.run_as_user, security.run_as_group or security.run_as_user
        default = (uid, gid) == (manifests.SANDBOX_UID, manifests.SANDBOX_UID)
        updates["user"] = "sandbox" if default else f"{uid}:{gid}"
    if policy is not None:
        updates["network_enabled"] = bool(policy.spec.egress)
    found = _GENERATION.fullmatch(pod_name.removeprefix(manifests.resource_name(sandbox_id)))
    return Attached(
        info=dict(info, ip=str(pod.status.pod_ip)),  # type: ignore[arg-type]
        pod_uid=str(pod.metadata.uid),
        generation=int(found.group(1)) if found else 1,
        config_updates=updates,
    )


async def _listed(list_fn: Any, namespace: str, name: str) -> Any:
    """The one object named ``name`` (listed: the Role has no ``get``), or None."""
    found = await api_call(
        f"reading {name}", list_fn, namespace, field_selector=f"metadata.name={name}"
    )
    return found.items[0] if found.items else None


async def _connection(kube: Kube, namespace: str, name: str) -> ConnectionInfo:
    secret = await _listed(kube.core.list_namespaced_secret, namespace, name)
    if secret is None:
        raise KernelError(
            f"the Secret {namespace}/{name} with the pod's kernel key is gone; "
            "its kernel cannot be reached (remove the sandbox)"
        )
    try:
        raw = base64.b64decode((secret.data or {})["KERNEL_SANDBOX_CONNECTION"])
        info = json.loads(raw)
        if info["transport"] != "tcp" or not isinstance(info["key"], str):
            raise ValueError(info["transport"])
    except (KeyError, ValueError, TypeError) as exc:
        raise KernelError(
            f"the Secret {namespace}/{name} carries no kernel connection; not a sandbox?"
        ) from exc
    return info  # type: ignore[no-any-return]


def kernel_number(listing: str) -> int:
    """The supervisor's current kernel: one past the last ``go-<n>`` (1 with none)."""
    numbers = [int(m.group(1)) for line in listing.split("\n") if (m := _GO.match(line.strip()))]
    return max(numbers, default=0) + 1
