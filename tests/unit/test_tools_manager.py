"""The manager's caller-facing contract, without a daemon: what raises and what not."""

from __future__ import annotations

import pytest

from kernel_sandbox import (
    ConfigError,
    DockerSandboxConfig,
    SandboxManager,
    SandboxManagerFactory,
    SandboxNotFoundError,
    SandboxType,
)
from kernel_sandbox.manager import SandboxManagerType


def test_the_factory_makes_a_local_manager() -> None:
    manager = SandboxManagerFactory.create_manager()
    assert isinstance(manager, SandboxManager)
    assert SandboxManagerFactory.get_registered_types() == [SandboxManagerType.LOCAL]
    assert SandboxManagerType.HTTP == "http"
    labelled = SandboxManagerFactory.create_manager(labels={"team": "data"})
    assert labelled.config.labels == {"team": "data"}


def test_base_url_gives_an_http_manager_and_bad_types_say_what_to_do() -> None:
    from kernel_sandbox.client.manager import HttpSandboxManager

    manager = SandboxManagerFactory.create_manager(base_url="http://sandboxes:8000", api_key="k")
    assert isinstance(manager, HttpSandboxManager)
    assert manager.base_url == "http://sandboxes:8000"
    with pytest.raises(ConfigError, match="needs base_url"):
        SandboxManagerFactory.create_manager("http")
    with pytest.raises(ConfigError, match="unknown manager type 'remote'"):
        SandboxManagerFactory.create_manager("remote")


async def test_bad_sandbox_requests_raise_config_errors_before_any_container() -> None:
    async with SandboxManagerFactory.create_manager() as manager:
        with pytest.raises(ConfigError, match="unknown sandbox type 'vm'; use one of: docker"):
            await manager.create_sandbox("vm")
        with pytest.raises(ConfigError, match="memory_limit"):
            await manager.create_sandbox(SandboxType.DOCKER, {"memory_limit": "lots"})
        with pytest.raises(ConfigError, match="unknown tool 'python'"):
            await manager.create_sandbox(SandboxType.DOCKER, {"tools_config": {"python": {}}})
        assert await manager.list_sandboxes() == []


async def test_an_unknown_sandbox_id_is_a_caller_error() -> None:
    async with SandboxManagerFactory.create_manager() as manager:
        calls = [
            manager.get_sandbox_info("nope"),
            manager.get_sandbox_tools("nope"),
            manager.execute_tool("nope", "python_executor", {"code": "1"}),
            manager.stop_sandbox("nope"),
            manager.delete_sandbox("nope"),
            manager.get_sandbox("nope"),
        ]
        for pending in calls:
            with pytest.raises(SandboxNotFoundError, match="no sandbox with id 'nope'") as info:
                await pending
            assert isinstance(info.value, KeyError)


def test_docker_config_defaults_to_no_tools_and_keeps_core_settings() -> None:
    cfg = DockerSandboxConfig(image="python:3.11-slim", timeout=10, network_enabled=False)
    assert cfg.tools_config == {}
    assert cfg.with_overrides(timeout=5).tools_config == {}
    loose = DockerSandboxConfig(tools_config={"python_executor": None})  # type: ignore[dict-item]
    assert loose.tools_config == {"python_executor": {}}
