"""The namespace as a whole: its sandboxes (``ps``), its leftovers (``gc``), pod states.

Everything kernel_sandbox makes carries the label ``kernel-sandbox=true`` and the owner's
pid and host, so a pod whose owner ran on this machine and is gone is an orphan; a Secret
or NetworkPolicy whose pod is gone is one too (the cluster's garbage collector normally
removes them with their pod, through ``ownerReferences``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from ...config import LABEL_PREFIX
from ..base import HostState, Leftover, SandboxRecord, owner_alive, this_owner
from .api import REMOVED_REASON, ApiException, Kube, api_call, kube

log = logging.getLogger(__name__)

__all__ = [
    "PodState",
    "default_namespace",
    "gc",
    "list_sandboxes",
    "pod_state",
    "relabel_owner",
    "remove_named",
]

#: Seconds a Secret or policy may exist before its pod does (a sandbox being made).
STARTING = 60.0


def default_namespace() -> str:
    """``KERNEL_SANDBOX_NAMESPACE``, else the pod's own namespace in a cluster, else the
    kubeconfig context's, else ``default``."""
    if os.environ.get("KERNEL_SANDBOX_NAMESPACE"):
        return os.environ["KERNEL_SANDBOX_NAMESPACE"]
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    with contextlib.suppress(OSError), open(f"{token_dir}/namespace") as handle:
        return handle.read().strip()
    with contextlib.suppress(Exception):
        from kubernetes import config as k8s_config

        _, context = k8s_config.list_kube_config_contexts(os.environ.get("KUBECONFIG"))
        return str(context["context"].get("namespace") or "default")
    return "default"


@dataclass(frozen=True)
class PodState(HostState):
    """:class:`HostState` with the pod's own reasons (evicted, deleted)."""

    evicted: bool = False

    def death_reason(self) -> str:
        if self.removed:
            return REMOVED_REASON
        if self.evicted:
            return (
                f"the pod was evicted by the kubelet ({self.error}); its files and variables "
                "are gone (raise disk_limit or memory_limit, or free the node)"
            )
        return super().death_reason()


async def list_sandboxes(host: str, labels: dict[str, str]) -> list[SandboxRecord]:
    """Sandbox pods of the namespace carrying all of ``labels``, as records."""
    selector = ",".join(f"{k}={v}" for k, v in {LABEL_PREFIX: "true", **labels}.items())
    pods = await api_call(
        "listing sandbox pods",
        kube().core.list_namespaced_pod,
        default_namespace(),
        label_selector=selector,
    )
    records = []
    for pod in pods.items:
        statuses = pod.status.container_statuses or []
        running = bool(statuses and statuses[0].state.running)
        state = "running" if running else (pod.status.reason or pod.status.phase or "?").lower()
        created = pod.metadata.creation_timestamp
        records.append(
            SandboxRecord(
                host=host,
                resource_id=pod.metadata.name,
                name=pod.metadata.name,
                image=pod.spec.containers[0].image,
                state=state,
                labels=dict(pod.metadata.labels or {}),
                created=created.timestamp() if created is not None else None,
            )
        )
    return records


async def gc(*, remove_all: bool = False) -> list[Leftover]:
    """Pods whose owner process (on this machine) is gone, and Secrets and policies
    whose pod is gone; with ``remove_all`` every object kernel_sandbox made here."""
    ns, api = default_namespace(), kube()
    selector = f"{LABEL_PREFIX}=true"
    pods, secrets, policies = await asyncio.gather(
        api_call("listing pods", api.core.list_namespaced_pod, ns, label_selector=selector),
        api_call("listing secrets", api.core.list_namespaced_secret, ns, label_selector=selector),
        api_call(
            "listing policies",
            api.networking.list_namespaced_network_policy,
            ns,
            label_selector=selector,
        ),
    )
    leftovers: list[Leftover] = []
    live_pods = set()
    for pod in pods.items:
        labels = pod.metadata.labels or {}
        if remove_all or _owner_gone(labels):
            leftovers.append(
                _leftover("pod", pod.metadata.name, api.core.delete_namespaced_pod, ns)
            )
        else:
            live_pods.add(pod.metadata.name)
    kinds = (
        ("secret", secrets, api.core.delete_namespaced_secret),
        ("networkpolicy", policies, api.networking.delete_namespaced_network_policy),
    )
    young = time.time() - STARTING
    for kind, found, delete in kinds:
        for item in found.items:
            # made just before their pod (a sandbox starting now), unless --all
            created = item.metadata.creation_timestamp
            if not remove_all and created is not None and created.timestamp() > young:
                continue
            if item.metadata.name not in live_pods:
                leftovers.append(_leftover(kind, item.metadata.name, delete, ns))
    return leftovers


def pod_state(pod: Any) -> PodState:
    """What a pod (a ``V1Pod`` from the API) says about the sandbox's kernel host."""
    status = pod.status
    if pod.metadata.deletion_timestamp is not None:
        return PodState(running=False, removed=True)
    if status.reason == "Evicted":
        return PodState(running=False, evicted=True, error=status.message or "Evicted")
    statuses = status.container_statuses or []
    state = statuses[0].state if statuses else None
    if state is not None and state.running is not None:
        return PodState(running=True)
    term = state.terminated if state is not None else None
    if term is not None:
        return PodState(
            running=False,
            exit_code=term.exit_code,
            oom_killed=term.reason == "OOMKilled",
            error=term.message or term.reason or "",
        )
    return PodState(running=False, error=f"the pod is {status.phase}")


async def remove_labelled(labels: dict[str, str], keep: frozenset[str], host: str) -> int:
    """Remove the sandboxes carrying ``labels`` (except sandbox ids in ``keep``) with
    their Secrets and policies; count them.  One that cannot be removed is logged."""
    rows = [r for r in await list_sandboxes(host, labels) if r.sandbox_id not in keep]
    for row in rows:
        try:
            await remove_named(row.resource_id)
        except Exception as exc:  # one wedged pod must not stop a server starting
            log.warning("could not remove leftover pod %s: %s", row.resource_id, exc)
    return len(rows)


async def remove_named(name: str) -> None:
    """Delete one sandbox's pod, Secret and NetworkPolicy (all named ``name``); gone ones
    are fine (a server removing what its killed predecessor left)."""
    ns, api = default_namespace(), kube()
    await asyncio.gather(
        _leftover("pod", name, api.core.delete_namespaced_pod, ns).remove(),
        _leftover("secret", name, api.core.delete_namespaced_secret, ns).remove(),
        _leftover("policy", name, api.networking.delete_namespaced_network_policy, ns).remove(),
    )


async def relabel_owner(kube_: Kube, namespace: str, name: str) -> None:
    """Label an adopted pod as this process's: its labels named the first owner, who is
    gone, and gc where that owner ran would take the pod for an orphan."""
    await api_call(
        "relabelling the adopted pod as this process's",
        kube_.core.patch_namespaced_pod,
        name,
        namespace,
        {"metadata": {"labels": this_owner()}},
    )


def _owner_gone(labels: dict[str, str]) -> bool:
    """True when the pod's owner ran on this machine and no longer runs."""
    return owner_alive(labels) is False


def _leftover(kind: str, name: str, delete: Any, namespace: str) -> Leftover:
    async def remove() -> None:
        options = {"grace_period_seconds": 0} if kind == "pod" else {}
        try:
            await api_call(f"deleting {kind} {name}", delete, name, namespace, **options)
        except ApiException as exc:
            if exc.status != 404:
                raise

    return Leftover(f"{kind} {namespace}/{name}", remove)
