"""SandboxConfig: safe defaults, and bad settings rejected with the setting named."""

from __future__ import annotations

import pytest

from kernel_sandbox.config import SandboxConfig, parse_size
from kernel_sandbox.errors import ConfigError, SandboxError
from kernel_sandbox.sandbox import AsyncSandbox


def test_defaults_are_the_safe_ones() -> None:
    c = SandboxConfig()
    assert (c.image, c.network_enabled, c.memory_limit, c.cpu_limit, c.pids_limit) == (
        "kernel-sandbox:datascience",
        False,
        "1g",
        1.0,
        256,
    )
    assert (c.user, c.working_dir, c.transport) == ("sandbox", "/sandbox", "ipc")
    assert c.disk_limit == "512m"


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("memory_limit", "lots", "memory_limit"),
        ("working_dir", "rel/path", "working_dir"),
        ("volumes", {"/x": {"mode": "rw"}}, "bind"),
        ("cpu_limit", 0, "cpu_limit"),
        ("disk_limit", "lots", "disk_limit"),
        ("disk_limit", "1m", "disk_limit='1m' is too small"),
        ("disk_limit", "15m", "disk_limit='15m' is too small: give at least 16"),
        ("memory_limit", "31m", "memory_limit='31m' is too small: give at least 32"),
        ("env_vars", {"A=B": "c"}, "env_vars: 'A=B' is not an environment variable name"),
        ("env_vars", {"": "c"}, "env_vars: '' is not an environment variable name"),
        ("env_vars", {"A": "b\0c"}, "env_vars: the value of 'A' holds a NUL byte"),
    ],
)
def test_invalid_settings_name_the_setting(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        SandboxConfig(**{field: value})  # type: ignore[arg-type]


def test_overrides_are_validated_and_unknown_fields_refused() -> None:
    c = SandboxConfig().with_overrides(memory_limit="512M", timeout=5)
    assert (c.memory_limit, c.timeout) == ("512m", 5)
    with pytest.raises(ValueError, match="imagee"):
        SandboxConfig().with_overrides(imagee="x")


def test_config_error_is_a_sandbox_error_and_a_value_error() -> None:
    assert issubclass(ConfigError, SandboxError) and issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("limit", ["16m", "512m", "1.5g", "700000k"])
def test_disk_budget_never_exceeds_the_limit(limit: str) -> None:
    budget = SandboxConfig(disk_limit=limit).disk_budget()
    assert set(budget) == {"working_dir", "home", "tmp", "shm"}
    assert sum(budget.values()) <= parse_size(limit)
    assert budget["working_dir"] == parse_size(limit) // 2


def test_no_disk_limit_means_no_budget() -> None:
    assert SandboxConfig(disk_limit=None).disk_budget() == {}
    with pytest.raises(ValueError, match="memory_limit"):
        SandboxConfig(memory_limit=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "overrides",
    [{"memory_limit": "lots"}, {"imagee": "x"}, {"cpu_limit": -1, "working_dir": "rel"}],
)
def test_bad_settings_raise_config_error_not_pydantics(overrides: dict[str, object]) -> None:
    """``except SandboxError`` must catch a bad setting, at construction and in overrides."""
    for make in (
        lambda: SandboxConfig(**overrides),  # type: ignore[arg-type]
        lambda: SandboxConfig().with_overrides(**overrides),
    ):
        with pytest.raises(ConfigError) as caught:
            make()
        for name in overrides:
            assert name in str(caught.value)


async def test_async_sandbox_create_with_a_bad_setting_raises_config_error() -> None:
    """Checked before any engine is contacted, so this needs none."""
    with pytest.raises(ConfigError, match="memory_limit='lots' is not a size"):
        await AsyncSandbox.create(memory_limit="lots")


@pytest.mark.parametrize(
    "path",
    [
        "/run/kernel-sandbox",
        "/run/kernel-sandbox/k",
        "/run//x/../kernel-sandbox",
        "/tmp/kernel-sandbox/s",
    ],
)
def test_working_dir_may_not_point_into_the_run_directory(path: str) -> None:
    with pytest.raises(ConfigError, match="where the kernel's connection lives"):
        SandboxConfig(working_dir=path)
    assert SandboxConfig(working_dir="/run/kernel-sandboxes").working_dir == "/run/kernel-sandboxes"
