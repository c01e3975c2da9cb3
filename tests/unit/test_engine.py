"""Without an engine the caller is told how to start one."""

from __future__ import annotations

import pytest

from kernel_sandbox.backends.docker import docker_client
from kernel_sandbox.errors import EngineUnavailableError


def test_missing_engine_message_says_how_to_start_it(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    docker_client.cache_clear()
    try:
        with pytest.raises(EngineUnavailableError) as info:
            docker_client()
    finally:
        docker_client.cache_clear()
    message = str(info.value)
    assert "no-such.sock" in message and "dockerd" in message and "docker` group" in message
