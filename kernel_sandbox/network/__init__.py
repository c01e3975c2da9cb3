"""What a sandbox may reach: the ``network=`` setting as values the whole package shares.

``policy`` turns ``network=`` into a checkable :class:`EgressPolicy` (host patterns,
special addresses) and holds the :class:`Decision` records a host's egress proxy logs;
``pipconf`` reads the host pip's index and CA for ``"packages"``; ``ceiling`` lowers a
requested policy to a server's per-key maximum.  The proxy that applies a policy runs
with the Docker host (:mod:`kernel_sandbox.backends.docker.egress`).
"""

from .ceiling import cap_network, requested_network
from .pipconf import PipSettings, host_pip_settings, parse_pip_config
from .policy import (
    Decision,
    EgressPolicy,
    HostPattern,
    build_policy,
    describe_network,
    is_special_address,
    parse_pattern,
)

__all__ = [
    "Decision",
    "EgressPolicy",
    "HostPattern",
    "PipSettings",
    "build_policy",
    "cap_network",
    "describe_network",
    "host_pip_settings",
    "is_special_address",
    "parse_pattern",
    "parse_pip_config",
    "requested_network",
]
