"""What a sandbox may reach: the ``network=`` setting turned into a checkable policy.

A policy is a list of host patterns.  A destination is allowed when its name (as the
sandbox asked for it) matches a pattern *and* every address that name resolves to on
the host is a public one.  Private, loopback, link-local and other special addresses
are refused unless the pattern that allows them is itself an address or a network
(``"10.0.0.5:3141"``, ``"10.0.0.0/8"``): a name never unlocks them, so a public name
that resolves to the host's loopback (DNS rebinding) gets nowhere.

Patterns::

    "files.example.org"      that name, ports 80 and 443
    "*.example.com:443"      any name below example.com (not example.com itself), port 443
    "10.0.0.5:3141"          that address and port (private addresses must be listed so)
    "10.0.0.0/8"             any address in that network, ports 80 and 443
    "packages"               the package index the host's pip uses (see ``pipconf``)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from .pipconf import PipSettings, host_pip_settings

__all__ = [
    "DEFAULT_PORTS",
    "Decision",
    "EgressPolicy",
    "HostPattern",
    "build_policy",
    "describe_network",
    "is_special_address",
    "parse_pattern",
]

#: Ports a pattern without ``:port`` allows.
DEFAULT_PORTS = (80, 443)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Addresses that are not "somewhere on the internet": refused unless listed.  Written
# out instead of ``is_private``, which also covers the documentation ranges that some
# TLS-intercepting networks hand out for public names.
_SPECIAL = [
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # this network
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata services
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, broadcast
        "::/96",  # unspecified, loopback, IPv4-compatible (::7f00:1 is 127.0.0.1)
        "::ffff:0:0:0/96",  # IPv4-translated (::ffff:0:7f00:1)
        "64:ff9b::/96",  # NAT64 (64:ff9b::7f00:1 reaches 127.0.0.1 through a NAT64)
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard
        "2001::/32",  # Teredo (embeds an IPv4 address)
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local
        "ff00::/8",  # multicast
    )
]


def is_special_address(address: str) -> bool:
    """True for loopback, private, link-local, multicast, reserved and unspecified."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            ip = mapped
    return any(ip.version == net.version and ip in net for net in _SPECIAL)


@dataclass(frozen=True)
class HostPattern:
    """One entry of a policy: a name, a ``*.`` suffix, an address or a network."""

    text: str
    #: Lower-case name without the ``*.`` (``""`` for an address pattern).
    name: str = ""
    wildcard: bool = False
    network: IPNetwork | None = None
    ports: tuple[int, ...] = DEFAULT_PORTS

    def matches_name(self, host: str, port: int) -> bool:
        """Does the name the sandbox asked for (not an address) match?"""
        if port not in self.ports or self.network is not None:
            return False
        if self.wildcard:
            return host.endswith("." + self.name)
        return host == self.name

    def matches_address(self, address: str, port: int) -> bool:
        """Is this address (a literal the sandbox asked for, or one a name resolved to)
        listed by this pattern?"""
        if port not in self.ports or self.network is None:
            return False
        ip = ipaddress.ip_address(address)
        return ip.version == self.network.version and ip in self.network


def _split_port(text: str) -> tuple[str, tuple[int, ...]]:
    host, port = text, ""
    if text.startswith("["):  # [v6]:port
        end = text.find("]")
        host, port = text[1:end], text[end + 1 :].removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not port:
        return host, DEFAULT_PORTS
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: {port!r} is not a port")
    return host, (int(port),)


def parse_pattern(text: str) -> HostPattern:
    """One host pattern; ``ValueError`` saying what is wrong with it."""
    raw = text.strip()
    if not raw or any(ch.isspace() or ch in "/?#@" for ch in raw.split("/", 1)[0]):
        raise ValueError(f"{text!r} is not a host pattern (e.g. 'files.example.org:443')")
    if "/" in raw:  # a network, ports 80 and 443
        try:
            return HostPattern(raw, network=ipaddress.ip_network(raw, strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not a network (e.g. '10.0.0.0/8')") from None
    host, ports = _split_port(raw)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return HostPattern(raw, network=ipaddress.ip_network(ip), ports=ports)
    host = host.lower().rstrip(".")
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    labels = name.split(".")
    if (
        not name
        or "*" in name
        or not all(label and all(ch.isalnum() or ch in "-_" for ch in label) for label in labels)
    ):
        raise ValueError(
            f"{text!r} is not a host pattern: use a name ('files.example.org'), "
            "'*.example.com' for the names below one, an address or a network"
        )
    return HostPattern(raw, name=name, wildcard=wildcard, ports=ports)


@dataclass(frozen=True)
class EgressPolicy:
    """A named set of host patterns; :meth:`check` says whether one destination may go.

    ``label`` is how refusals name the policy (``"packages"``, or the list given).
    """

    label: str
    patterns: tuple[HostPattern, ...]

    @classmethod
    def from_patterns(cls, label: str, patterns: Iterable[str]) -> EgressPolicy:
        """Parse every pattern (``ValueError`` naming the first bad one)."""
        return cls(label, tuple(parse_pattern(p) for p in patterns))

    def allowed_text(self) -> str:
        """The destinations allowed, for messages and tool descriptions."""
        return ", ".join(p.text for p in self.patterns) or "nothing"

    def check(self, host: str, port: int, addresses: Sequence[str] | None = None) -> str | None:
        """None if ``host:port`` may be reached at ``addresses``, else why not.

        Call it twice: first with ``addresses=None`` (before resolving anything, so a
        name outside the policy costs no DNS query), then with what the name resolved
        to.  A literal address is checked in one go.
        """
        host = host.lower().rstrip(".")
        try:
            literal = str(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            literal = None
        if literal is not None:
            if any(p.matches_address(literal, port) for p in self.patterns):
                return None
            if is_special_address(literal):
                return f"{literal} is a private or loopback address and is not listed"
            return f"the address {literal}:{port} is not listed"
        if not any(p.matches_name(host, port) for p in self.patterns):
            return f"{host}:{port} is not allowed"
        if addresses is None:
            return None
        if not addresses:
            return f"{host} does not resolve to any address"
        for address in addresses:
            if is_special_address(address) and not any(
                p.matches_address(address, port) for p in self.patterns
            ):
                return (
                    f"{host} resolves to {address}, a private or loopback address that is "
                    "not listed"
                )
        return None


@dataclass(frozen=True)
class Decision:
    """One decision of the proxy, as logged."""

    at: float
    host: str
    port: int
    allowed: bool
    #: Why it was refused, or the address it went to.
    detail: str
    method: str = "CONNECT"


def build_policy(network: str | list[str], pip: PipSettings | None = None) -> EgressPolicy:
    """The policy of ``network="packages"`` or a list of patterns (``"packages"`` may be
    one entry of the list).  ``ConfigError`` for a bad pattern."""
    entries = [network] if isinstance(network, str) else list(network)
    patterns: list[str] = []
    for entry in entries:
        if entry == "packages":
            patterns += (pip or host_pip_settings()).index_patterns()
        else:
            patterns.append(entry)
    label = network if isinstance(network, str) else "network=" + repr(list(network))
    try:
        return EgressPolicy.from_patterns(label, dict.fromkeys(patterns))
    except ValueError as exc:
        raise ConfigError(f"network: {exc}") from None


def describe_network(network: str | list[str], pip: PipSettings | None = None) -> str:
    """One sentence for a model or a person: what the sandbox's code may reach."""
    if network == "none":
        return "There is no network access: pip install and downloads will fail."
    if network == "full":
        return "Network access is enabled."
    policy = build_policy(network, pip)
    uses_packages = network == "packages" or "packages" in network
    pip_line = (
        " `pip install NAME` (or `%pip install NAME` in Python) installs from the package "
        "index into your user site; the package imports in the next call."
        if uses_packages
        else ""
    )
    return (
        f"Network access is limited to: {policy.allowed_text()} (through a proxy; other "
        f"destinations get HTTP 403).{pip_line}"
    )
