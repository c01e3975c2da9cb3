"""Who may reach a sandbox pod's kernel, and what its Secret and policy belong to.

The NetworkPolicy made with each pod admits ingress to the kernel's ports from the
client alone: pods with the client's labels (``KERNEL_SANDBOX_CLIENT_LABELS``, set by
the in-cluster server's Deployment) or else the client's own address as a ``/32``.
That address is only known for sure once the pod has an IP (the route to the pod can
leave from another interface than the one facing the API server), so the policy is
narrowed again then, and again when another process takes a sandbox over
(:meth:`KubernetesHost.attach`).  The Secret and the policy are then made the pod's
dependents (``ownerReferences``), so the cluster removes them with their pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
from typing import Any

from . import manifests
from .api import Kube, api_call

__all__ = ["admit", "client_cidr", "client_pod_labels", "local_address_towards", "own_by_pod"]


def client_pod_labels() -> dict[str, str] | None:
    """Labels that select this process's pod (``KERNEL_SANDBOX_CLIENT_LABELS=k=v,k=v``).

    The in-cluster server's Deployment sets them, so sandbox pods admit only the server.
    """
    raw = os.environ.get("KERNEL_SANDBOX_CLIENT_LABELS", "")
    pairs = [item.split("=", 1) for item in raw.split(",") if "=" in item]
    return {k.strip(): v.strip() for k, v in pairs} or None


def local_address_towards(ip: str) -> str | None:
    """The address this machine sends from to reach ``ip`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((ip, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def client_cidr(kube: Kube, pod_ip: str | None) -> str | None:
    """The client's address as a /32, when the client is not a labelled pod; before the
    pod has an IP, the address facing the API server."""
    if client_pod_labels():
        return None
    target = pod_ip or (kube.host.split("//")[-1].split(":")[0] or "127.0.0.1")
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(target)
        local = local_address_towards(target)
        return f"{local}/32" if local else None
    return None


async def admit(kube: Kube, namespace: str, name: str, cidr: str | None) -> None:
    """Make the policy ``name`` admit this client (its labels, or ``cidr``) alone."""
    client = client_pod_labels()
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": client}}] if client else []
    if cidr:
        peers.append({"ipBlock": {"cidr": cidr}})
    ports = [{"protocol": "TCP", "port": port} for port in manifests.KERNEL_PORTS]
    patch = {"spec": {"ingress": [{"from": peers, "ports": ports}] if peers else []}}
    await api_call(
        "updating the sandbox's NetworkPolicy",
        kube.networking.patch_namespaced_network_policy,
        name,
        namespace,
        patch,
    )


async def own_by_pod(kube: Kube, namespace: str, name: str, pod_uid: str) -> None:
    """Make the pod own its Secret and policy, so they go when it goes (from anywhere)."""
    owner = {
        "metadata": {
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod_uid}]
        }
    }
    await asyncio.gather(
        api_call("adopting the Secret", kube.core.patch_namespaced_secret, name, namespace, owner),
        api_call(
            "adopting the NetworkPolicy",
            kube.networking.patch_namespaced_network_policy,
            name,
            namespace,
            owner,
        ),
    )
