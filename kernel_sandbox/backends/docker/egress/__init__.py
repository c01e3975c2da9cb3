"""Egress for Docker sandboxes without a network: a host-side proxy that applies a policy.

The container keeps ``network_mode="none"`` (only ``lo``).  A relay inside listens on
127.0.0.1 and forwards to a proxy on the host through a unix socket that only this
sandbox has mounted; the proxy decides every connection by the sandbox's ``network=``
policy (:mod:`kernel_sandbox.network`) before anything leaves the host, and is bounded
per sandbox (``proxy``).  ``container`` wires one sandbox's egress together.
"""

from .container import CONTAINER_EGRESS_DIR, RELAY_PORT, SandboxEgress
from .proxy import EgressLimits, EgressProxy

__all__ = [
    "CONTAINER_EGRESS_DIR",
    "RELAY_PORT",
    "EgressLimits",
    "EgressProxy",
    "SandboxEgress",
]
