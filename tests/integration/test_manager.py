"""The manager against the real engine: lifecycle, tools by id, cleanup on exit."""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from kernel_sandbox import (
    DockerSandboxConfig,
    SandboxManagerFactory,
    SandboxNotFoundError,
    SandboxStatus,
    SandboxType,
)
from tests.conftest import TEST_LABEL
from tests.integration.conftest import PYTHON_IMAGE

ALL_TOOLS = {"python_executor": {}, "shell_executor": {}, "file_operation": {}}


def containers_of(client: docker.DockerClient, sandbox_id: str) -> list[object]:
    return client.containers.list(all=True, filters={"label": f"kernel-sandbox.id={sandbox_id}"})


async def test_lifecycle_tools_and_cleanup(
    docker_engine: docker.DockerClient, tmp_path: Path
) -> None:
    (tmp_path / "input.csv").write_text("x\n1\n")
    tmp_path.chmod(0o755)  # the container's user must be able to read the mount
    async with SandboxManagerFactory.create_manager(labels=TEST_LABEL) as manager:
        config = DockerSandboxConfig(
            image=PYTHON_IMAGE,
            tools_config=ALL_TOOLS,
            volumes={str(tmp_path): {"bind": "/sandbox/data", "mode": "ro"}},
        )
        first = await manager.create_sandbox(SandboxType.DOCKER, config, sandbox_id="analysis")
        second = await manager.create_sandbox(
            "docker", {"image": PYTHON_IMAGE, "tools_config": {"python_executor": {"timeout": 5}}}
        )
        assert first == "analysis"

        tools = await manager.get_sandbox_tools(first)
        assert list(tools) == list(ALL_TOOLS)
        assert "/sandbox/data (read-only)" in tools["python_executor"]["function"]["description"]
        assert list(await manager.get_sandbox_tools(second)) == ["python_executor"]
        flat = await manager.get_sandbox_tools(first, format="responses")
        assert flat["shell_executor"]["name"] == "shell_executor"

        # the mounted host directory is visible through the tools
        listed = await manager.execute_tool(
            first, "file_operation", {"operation": "list", "file_path": "/sandbox/data"}
        )
        assert "input.csv" in listed.output
        # a tool that is not enabled in this sandbox
        refused = await manager.execute_tool(second, "shell_executor", {"command": "ls"})
        assert (
            refused.error
            == "unknown tool 'shell_executor'; the available tools are: python_executor"
        )

        infos = {i.id: i for i in await manager.list_sandboxes()}
        assert set(infos) == {first, second}
        info = await manager.get_sandbox_info(first)
        assert (info.status, info.type, info.image) == (
            SandboxStatus.RUNNING,
            SandboxType.DOCKER,
            PYTHON_IMAGE,
        )
        assert info.container_id and containers_of(
            docker_engine, (await manager.get_sandbox(first)).id
        )
        assert list(info.available_tools) == list(ALL_TOOLS)

        # stop: the container goes, the record stays, tool calls are refused politely
        first_container = (await manager.get_sandbox(first)).id
        assert await manager.stop_sandbox(first) is True
        assert containers_of(docker_engine, first_container) == []
        assert (await manager.get_sandbox_info(first)).status == SandboxStatus.STOPPED
        stopped = await manager.execute_tool(first, "python_executor", {"code": "1"})
        assert stopped.status == "error" and "is stopped" in (stopped.error or "")
        assert [i.id for i in await manager.list_sandboxes(SandboxStatus.RUNNING)] == [second]

        # delete: forgotten
        assert await manager.delete_sandbox(first) is True
        with pytest.raises(SandboxNotFoundError):
            await manager.get_sandbox_info(first)
        stats = await manager.get_stats()
        assert stats["total_sandboxes"] == 1

        second_container = (await manager.get_sandbox(second)).id
        assert containers_of(docker_engine, second_container)
    # leaving the block removed what was left
    assert containers_of(docker_engine, second_container) == []


async def test_a_sandbox_whose_container_vanished(docker_engine: docker.DockerClient) -> None:
    async with SandboxManagerFactory.create_manager(labels=TEST_LABEL) as manager:
        sid = await manager.create_sandbox(
            SandboxType.DOCKER, DockerSandboxConfig(image=PYTHON_IMAGE, tools_config=ALL_TOOLS)
        )
        await manager.execute_tool(sid, "python_executor", {"code": "x = 1"})
        sandbox = await manager.get_sandbox(sid)
        docker_engine.api.remove_container(sandbox.container_id, force=True)

        for name, args in [
            ("python_executor", {"code": "x"}),
            ("shell_executor", {"command": "ls"}),
            ("file_operation", {"operation": "read", "file_path": "a.txt"}),
            ("file_operation", {"operation": "write", "file_path": "a.txt", "content": "x"}),
        ]:
            result = await manager.execute_tool(sid, name, args)
            assert result.status == "error", name
            assert "container was removed" in (result.error or ""), (name, result.error)
        python = await manager.execute_tool(sid, "python_executor", {"code": "x"})
        assert python.metadata["state_lost"] is True
        info = await manager.get_sandbox_info(sid)
        assert info.status == SandboxStatus.ERROR
        assert "container was removed" in info.metadata["error"]


async def test_manager_pool_option_hands_out_warm_sandboxes_without_state(
    docker_engine: docker.DockerClient,
) -> None:
    pool_config = DockerSandboxConfig(image=PYTHON_IMAGE, tools_config=ALL_TOOLS)
    manager = SandboxManagerFactory.create_manager(
        labels=TEST_LABEL, pool_size=1, pool_config=pool_config
    )
    async with manager:
        mine = {"label": ["kernel-sandbox.pool", f"kernel-sandbox.owner-pid={os.getpid()}"]}
        assert len(docker_engine.containers.list(filters=mine)) == 1  # warm and idle
        first = await manager.create_sandbox(SandboxType.DOCKER, pool_config)
        sandbox = await manager.get_sandbox(first)
        assert "kernel-sandbox.pool" in sandbox.config.labels
        await manager.execute_tool(first, "python_executor", {"code": "secret = 1"})
        await manager.delete_sandbox(first)
        second = await manager.create_sandbox(SandboxType.DOCKER, pool_config)
        probe = await manager.execute_tool(
            second, "python_executor", {"code": "print('secret' in dir())"}
        )
        assert probe.output.strip() == "False"
        # A config the pool does not keep is started the ordinary way.
        other = await manager.create_sandbox(
            SandboxType.DOCKER, {"image": PYTHON_IMAGE, "memory_limit": "256m"}
        )
        assert "kernel-sandbox.pool" not in (await manager.get_sandbox(other)).config.labels
    mine = {"label": ["kernel-sandbox.pool", f"kernel-sandbox.owner-pid={os.getpid()}"]}
    assert not docker_engine.containers.list(all=True, filters=mine)
