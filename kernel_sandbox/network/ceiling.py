"""A maximum network policy, for servers that create sandboxes for others.

A server gives each API key a ceiling (``"none"``, ``"packages"``, a list of patterns,
``"full"``) and lowers what a client asks for to fit under it, saying what it changed,
as it does for memory and time.  Policies are ordered ``none`` < a list < ``full``;
between lists, an entry survives only if the ceiling has the same entry (``"packages"``
is an entry like any other).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Network", "cap_network", "requested_network"]

Network = str | list[str]


def requested_network(raw: dict[str, Any]) -> Network:
    """What a client's raw configuration asks for: ``network``, else the old alias.

    A ``network`` string that is no policy is ms-enclave's Docker network name (its
    client sends ``"bridge"``): it says nothing here, and ``network_enabled`` decides.
    """
    network = raw.get("network")
    if isinstance(network, list | tuple):
        return [str(entry) for entry in network]
    if network in ("none", "packages", "full"):
        return str(network)
    return "full" if raw.get("network_enabled") else "none"


def _entries(network: Network) -> list[str]:
    return [network] if isinstance(network, str) else list(network)


def cap_network(requested: Network, ceiling: Network) -> tuple[Network, list[str]]:
    """``requested`` lowered to fit under ``ceiling``; notes say what was taken away."""
    if ceiling == "full" or requested == "none":
        return requested, []
    if ceiling == "none":
        return "none", [f"network={requested!r} lowered to 'none': this key has no network"]
    if requested == "full":
        return ceiling, [f"network='full' lowered to {ceiling!r}, this key's maximum"]
    allowed = set(_entries(ceiling))
    kept = [entry for entry in _entries(requested) if entry in allowed]
    dropped = [entry for entry in _entries(requested) if entry not in allowed]
    if not dropped:
        return requested, []
    result: Network = "none" if not kept else kept[0] if kept == ["packages"] else kept
    return result, [f"network entries {dropped!r} dropped: beyond this key's maximum {ceiling!r}"]
