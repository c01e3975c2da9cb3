"""The server's per-key maximum network policy (``kernel-sandbox serve``)."""

from __future__ import annotations

from typing import Any

import click
import pytest
from pydantic import ValidationError

from kernel_sandbox.cli.run import parse_network
from kernel_sandbox.cli.serve import _key_networks
from kernel_sandbox.server.auth import ANONYMOUS, key_id
from kernel_sandbox.server.policy import client_config
from kernel_sandbox.server.settings import ServerSettings

#: What ms-enclave's client sends by default: its Docker network name and the old switch.
ENCLAVE: dict[str, Any] = {"network": "bridge", "network_enabled": True}


def test_the_default_maximum_is_no_network_and_says_so() -> None:
    cfg, notes = client_config(dict(ENCLAVE), ServerSettings())
    assert cfg.network == "none" and not cfg.network_enabled
    assert any("lowered to 'none'" in note for note in notes)


def test_allow_network_is_the_old_full_maximum() -> None:
    settings = ServerSettings(allow_network=True)
    assert settings.max_network == "full"
    assert client_config(dict(ENCLAVE), settings)[0].network == "full"


def test_each_key_gets_its_own_maximum() -> None:
    settings = ServerSettings(
        api_keys=("key-a", "key-b"),
        max_network="none",
        key_networks={key_id("key-a"): "packages"},
    )
    a, notes = client_config(dict(ENCLAVE), settings, key_id("key-a"))
    assert a.network == "packages" and "maximum" in notes[0]  # 'full' asked, 'packages' given
    assert client_config(dict(ENCLAVE), settings, key_id("key-b"))[0].network == "none"
    assert client_config({"network": "packages"}, settings, key_id("key-a"))[1] == []


def test_a_list_is_cut_to_the_entries_the_key_may_have() -> None:
    settings = ServerSettings(max_network=["packages", "files.example.org"])
    cfg, notes = client_config(
        {"network": ["files.example.org", "other.example.net"]}, settings, ANONYMOUS
    )
    assert cfg.network == ["files.example.org"] and "other.example.net" in notes[0]


def test_bad_maxima_are_refused() -> None:
    with pytest.raises(ValidationError, match="not a host pattern"):
        ServerSettings(max_network=["a b"])
    with pytest.raises(click.BadParameter):
        parse_network("a b")


def test_key_networks_from_the_command_line_are_stored_by_key_id() -> None:
    found = _key_networks(("key-a=packages", "0123456789abcdef=x.org,y.org"), ("key-a",))
    assert found == {key_id("key-a"): "packages", "0123456789abcdef": ["x.org", "y.org"]}
    with pytest.raises(click.BadParameter):
        _key_networks(("nonsense",), ())
