"""The server's limits: parsed once, never zero or unbounded, every default clamped.

Findings of issue 22 item 2 (``memory_limit: "0"`` meant no limit at all; a client that
named no limit got 1g / 1 CPU / 30 s under far lower maxima), item 12 (tool options'
``max_timeout`` past ``--max-timeout``) and the ``--allow-image`` pattern that matched
another registry.
"""

from __future__ import annotations

import math

import pytest

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.limits import MAX_SIZE_BYTES, parse_positive, parse_size
from kernel_sandbox.server.image_policy import image_allowed, parse_reference
from kernel_sandbox.server.policy import client_config
from kernel_sandbox.server.settings import ServerSettings

ZEROS = ["0", "0b", "0k", "0.0g", " 0", "0000", "0.4b", "0m "]
TIGHT = ServerSettings(max_memory="128m", max_cpu=0.5, max_timeout=5, max_disk="64m")


@pytest.mark.parametrize("value", ZEROS)
def test_zero_sizes_are_refused_in_every_spelling(value: str) -> None:
    with pytest.raises(ValueError, match=r"memory_limit=.*too small"):
        parse_size(value, "memory_limit")
    with pytest.raises(ConfigError, match="memory_limit"):
        SandboxConfig(memory_limit=value)
    with pytest.raises(ConfigError, match="memory_limit"):
        client_config({"memory_limit": value}, TIGHT)


@pytest.mark.parametrize("value", ["-1", "1e3", "nan", "inf", "", "1 g", "9" * 400, "2p"])
def test_sizes_that_are_not_a_bounded_number_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="disk_limit"):
        parse_size(value, "disk_limit")


def test_sizes_parse_to_whole_bytes_within_bounds() -> None:
    assert parse_size("512m") == 512 * 1024**2
    assert parse_size(" 1.5G ") == 1536 * 1024**2
    assert parse_size("1048576g".replace("1048576", str(MAX_SIZE_BYTES // 1024**3))) == (
        MAX_SIZE_BYTES
    )
    with pytest.raises(ValueError, match="too large"):
        parse_size(f"{MAX_SIZE_BYTES + 1}")


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, -math.inf, "nan", "x", True, None])
def test_cpu_and_timeout_must_be_finite_and_positive(value: object) -> None:
    with pytest.raises(ValueError, match="cpu_limit"):
        parse_positive(value, "cpu_limit")
    for field in ("cpu_limit", "timeout"):
        with pytest.raises(ConfigError, match=field):
            client_config({field: value} if value is not None else {field: "none"}, TIGHT)


def test_defaults_are_clamped_for_a_client_that_names_no_limit() -> None:
    cfg, notes = client_config({}, TIGHT)
    assert (cfg.memory_limit, cfg.cpu_limit, cfg.timeout, cfg.disk_limit) == (
        "128m",
        0.5,
        5,
        "64m",
    )
    assert notes == []  # nothing the client asked for was lowered


def test_asked_limits_are_clamped_and_said() -> None:
    asked = {"memory_limit": "4g", "cpu_limit": 8, "timeout": 1e9, "disk_limit": "10g"}
    cfg, notes = client_config(asked, TIGHT)
    assert (cfg.memory_limit, cfg.cpu_limit, cfg.timeout, cfg.disk_limit) == (
        "128m",
        0.5,
        5,
        "64m",
    )
    assert len(notes) == 4 and all("lowered" in note for note in notes)
    small, _ = client_config({"memory_limit": "64m", "timeout": 2}, TIGHT)
    assert (small.memory_limit, small.timeout) == ("64m", 2)


def test_no_disk_limit_from_a_client_still_gets_the_servers_bound() -> None:
    cfg, _ = client_config({"disk_limit": None}, TIGHT)
    assert cfg.disk_limit == "64m"


@pytest.mark.parametrize("field", ["max_memory", "max_disk"])
@pytest.mark.parametrize("value", ["0", "0k", "lots"])
def test_server_maxima_are_parsed_by_the_same_rules(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field):
        ServerSettings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_cpu"):
        ServerSettings(max_cpu=math.inf)


def test_tool_timeouts_are_clamped_by_max_timeout() -> None:
    tools = {
        "python_executor": {"max_timeout": 1e9, "timeout": 1e9},
        "shell_executor": None,
        "file_operation": {},
    }
    cfg, _ = client_config({"tools_config": tools}, TIGHT)
    assert cfg.tools_config["python_executor"] == {"max_timeout": 5, "timeout": 5}
    assert cfg.tools_config["shell_executor"] == {"max_timeout": 5}
    assert cfg.tools_config["file_operation"] == {}
    with pytest.raises(ConfigError, match="max_timeout"):
        client_config({"tools_config": {"python_executor": {"max_timeout": "nan"}}}, TIGHT)


def test_server_never_pulls_nor_derives_by_default() -> None:
    cfg, _ = client_config({}, ServerSettings())
    assert (cfg.pull_image, cfg.derive_image) == (False, False)
    cfg, _ = client_config({}, ServerSettings(pull="allowed", derive=True))
    assert (cfg.pull_image, cfg.derive_image) == (True, True)


@pytest.mark.parametrize(
    ("image", "pattern", "allowed"),
    [
        ("kernel-sandbox:python", "kernel-sandbox*", True),
        ("kernel-sandbox-derived:abc", "kernel-sandbox*", True),
        ("kernel-sandbox.attacker.example/evil", "kernel-sandbox*", False),
        ("kernel-sandbox.attacker.example/evil:1", "kernel-sandbox*:*", False),
        ("docker.io/library/python:3.11-slim", "python:3.11-slim", True),
        ("python:3.12", "python:3.11-slim", False),
        ("myorg/app/extra:1", "myorg/*", False),
        ("myorg/app:1", "myorg/*", True),
        ("localhost:5000/app:1", "app*", False),
        ("registry.example/team/app:2", "registry.example/team/*", True),
        ("anything.example/x", "*", True),
        ("python@sha256:" + "a" * 64, "python", True),
    ],
)
def test_allow_image_matches_whole_references(image: str, pattern: str, allowed: bool) -> None:
    assert image_allowed(image, (pattern,)) is allowed


@pytest.mark.parametrize("image", ["", "a b", "x\nFROM evil", "../x", "/abs", "a//b", "x:"])
def test_malformed_references_are_refused(image: str) -> None:
    with pytest.raises(ConfigError, match="not an image reference"):
        parse_reference(image)
    with pytest.raises(ConfigError):
        client_config({"image": image}, ServerSettings())


def test_a_refused_image_names_the_allowed_patterns() -> None:
    settings = ServerSettings(allowed_images=("kernel-sandbox*",))
    with pytest.raises(ConfigError, match="not allowed"):
        client_config({"image": "kernel-sandbox.attacker.example/evil"}, settings)
