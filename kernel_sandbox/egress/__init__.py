"""Egress for sandboxes without a network: a host-side proxy that applies a policy.

The container keeps ``network_mode="none"`` (only ``lo``).  A relay inside listens on
127.0.0.1 and forwards to a proxy on the host through a unix socket that only this
sandbox has mounted; the proxy decides every connection by the sandbox's ``network=``
policy before anything leaves the host (``policy``), reads the host pip's index and CA
for ``"packages"`` (``pipconf``), and is bounded per sandbox (``proxy``).
``container`` wires one sandbox's egress together; ``ceiling`` lowers a requested
policy to a server's per-key maximum.
"""

from .ceiling import cap_network, requested_network
from .container import (
    CONTAINER_EGRESS_DIR,
    RELAY_PORT,
    SandboxEgress,
    build_policy,
    describe_network,
)
from .pipconf import PipSettings, host_pip_settings, parse_pip_config
from .policy import EgressPolicy, HostPattern, is_special_address, parse_pattern
from .proxy import Decision, EgressLimits, EgressProxy

__all__ = [
    "CONTAINER_EGRESS_DIR",
    "RELAY_PORT",
    "Decision",
    "EgressLimits",
    "EgressPolicy",
    "EgressProxy",
    "HostPattern",
    "PipSettings",
    "SandboxEgress",
    "build_policy",
    "cap_network",
    "describe_network",
    "host_pip_settings",
    "is_special_address",
    "parse_pattern",
    "parse_pip_config",
    "requested_network",
]
