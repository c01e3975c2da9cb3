"""Egress policy, the host pip's settings and the ``network=`` setting, without a proxy."""

from __future__ import annotations

import pytest

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.network import (
    EgressPolicy,
    PipSettings,
    build_policy,
    describe_network,
    is_special_address,
    parse_pattern,
    parse_pip_config,
)
from kernel_sandbox.network.pipconf import PYPI_FILES_HOST, PYPI_INDEX


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.2.3.4",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "100.64.0.1",
        "::1",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "224.0.0.1",
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "64:ff9b::7f00:1",  # NAT64
        "::ffff:0:7f00:1",  # IPv4-translated
        "64:ff9b:1::a00:1",  # local-use NAT64
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    ],
)
def test_special_addresses(address: str) -> None:
    assert is_special_address(address)


@pytest.mark.parametrize("address", ["93.184.215.14", "203.0.113.80", "2606:4700::1"])
def test_public_addresses(address: str) -> None:
    assert not is_special_address(address)


def test_names_wildcards_and_ports() -> None:
    policy = EgressPolicy.from_patterns("t", ["files.example.org", "*.example.com:443"])
    assert policy.check("files.example.org", 443) is None
    assert policy.check("FILES.example.org.", 80) is None
    assert policy.check("files.example.org", 8080) is not None
    assert policy.check("a.b.example.com", 443) is None
    assert policy.check("a.example.com", 80) is not None
    assert policy.check("example.com", 443) is not None  # the wildcard is below it only
    assert policy.check("evil-example.com", 443) is not None


def test_a_name_never_unlocks_a_private_address() -> None:
    policy = EgressPolicy.from_patterns("t", ["mirror.example.org", "10.0.0.0/8", "127.0.0.1:3141"])
    assert policy.check("mirror.example.org", 443, ["93.184.215.14"]) is None
    why = policy.check("mirror.example.org", 443, ["127.0.0.1"])
    assert why is not None and "loopback" in why
    assert policy.check("mirror.example.org", 443, ["10.1.1.1"]) is None  # listed network
    assert policy.check("mirror.example.org", 443, []) is not None
    assert policy.check("127.0.0.1", 3141) is None
    assert policy.check("127.0.0.1", 443) is not None
    assert policy.check("10.9.9.9", 443) is None
    assert policy.check("192.168.0.1", 443) is not None


@pytest.mark.parametrize(
    "bad", ["", "a b", "http://x.org", "*", "x.*.org", "x.org:99999", "1.2.3.4/99"]
)
def test_bad_patterns(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_pattern(bad)


def test_pip_config_listing() -> None:
    listing = "\n".join(
        [
            ":env:.cert='/etc/ssl/ca.pem'",
            "global.cert='/other.pem'",
            "global.index-url='https://user:secret@mirror.example.org:8443/simple'",
            "install.extra-index-url='file:///opt/pypi/simple https://extra.example.net/simple'",
            "global.find-links='/opt/wheels'",
        ]
    )
    settings = parse_pip_config(listing)
    assert settings.index_url == "https://mirror.example.org:8443/simple"  # no credentials
    assert settings.extra_index_urls == ("https://extra.example.net/simple",)  # no file URLs
    assert settings.cert == "/etc/ssl/ca.pem"  # the environment wins
    assert settings.index_patterns() == ["mirror.example.org:8443", "extra.example.net:443"]


def test_pip_defaults_to_its_own_index_and_file_host() -> None:
    settings = parse_pip_config("global.extra-index-url='file:///opt/pypi/simple'")
    assert settings.index_url == PYPI_INDEX
    index_host = PYPI_INDEX.split("/")[2]
    assert settings.index_patterns() == [f"{index_host}:443", f"{PYPI_FILES_HOST}:443"]


def test_packages_policy_and_description() -> None:
    pip = PipSettings("http://mirror.example.org/simple")
    policy = build_policy(["packages", "files.example.org"], pip)
    assert policy.check("mirror.example.org", 80) is None
    assert policy.check("mirror.example.org", 443) is not None
    assert policy.check("files.example.org", 443) is None
    text = describe_network("packages", pip)
    assert "mirror.example.org:80" in text and "pip install" in text
    assert "no network" in describe_network("none").lower()


def test_network_setting_and_its_alias() -> None:
    assert SandboxConfig().network == "none" and not SandboxConfig().egress
    assert SandboxConfig(network_enabled=True).network == "full"
    packages = SandboxConfig(network="packages")
    assert packages.egress and not packages.network_enabled
    assert packages.with_overrides(network_enabled=True).network == "full"
    assert SandboxConfig(network=["packages", "*.example.com:443"]).egress
    with pytest.raises(ConfigError, match="disagree"):
        SandboxConfig(network="packages", network_enabled=True)
    with pytest.raises(ConfigError, match="not a host pattern"):
        SandboxConfig(network=["files example"])
    with pytest.raises(ConfigError, match="allows nothing"):
        SandboxConfig(network=[])


def test_the_model_is_told_what_the_policy_allows() -> None:
    from kernel_sandbox.agent.messages import system_prompt

    assert "no network" in system_prompt(network="none")
    assert "has network access" in system_prompt(network=True)
    prompt = system_prompt(network=["files.example.org"])
    assert "limited to: files.example.org" in prompt and "pip install" not in prompt


def test_network_option_of_the_cli() -> None:
    import click
    from click.testing import CliRunner

    from kernel_sandbox.cli.run import sandbox_options

    @click.command()
    @sandbox_options
    def show(image: str, timeout: float, network: object) -> None:
        click.echo(repr(network))

    def run(*args: str) -> str:
        return CliRunner().invoke(show, list(args)).output.strip()

    assert run() == "'none'"
    assert run("--network") == "'full'"
    assert run("--network", "packages") == "'packages'"
    assert run("--network", "packages,*.example.com:443") == "['packages', '*.example.com:443']"
    assert "not a host pattern" in run("--network", "a b")


def test_a_servers_ceiling_lowers_what_a_client_asks_for() -> None:
    from kernel_sandbox.network.ceiling import cap_network, requested_network

    assert requested_network({"network_enabled": True}) == "full"  # ms-enclave's default
    assert requested_network({"network": ["a.org"], "network_enabled": True}) == ["a.org"]
    assert cap_network("full", "full") == ("full", [])
    assert cap_network("full", "packages")[0] == "packages"
    assert cap_network("packages", "none")[0] == "none"
    assert cap_network("none", "packages") == ("none", [])
    assert cap_network("packages", "packages") == ("packages", [])
    assert cap_network(["packages", "x.org"], "packages")[0] == "packages"
    assert cap_network(["x.org", "y.org"], ["y.org", "packages"])[0] == ["y.org"]
    assert cap_network(["x.org"], ["packages"])[0] == "none"
    lowered, notes = cap_network("full", ["packages"])
    assert lowered == ["packages"] and "maximum" in notes[0]
