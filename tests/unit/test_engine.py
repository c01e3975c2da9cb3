"""Without an engine the caller is told how to start one; what one create asks of it."""

from __future__ import annotations

import asyncio
import time

import pytest

from kernel_sandbox.backends.docker import docker_client
from kernel_sandbox.backends.docker import engine as engine_module
from kernel_sandbox.backends.docker.engine import ImageUser
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


async def test_sandboxes_started_at_once_share_one_user_probe(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(engine_module, "_image_users", {})
    probes = []

    def probe(self, image: str, user: str) -> ImageUser:  # type: ignore[no-untyped-def]
        probes.append((image, user))
        time.sleep(0.05)  # a probe container takes a while: the others arrive meanwhile
        return ImageUser(1000, 1000, "/home/sandbox")

    monkeypatch.setattr(engine_module.DockerEngine, "_image_user_sync", probe)
    engines = [engine_module.DockerEngine(client=object()) for _ in range(8)]  # type: ignore[arg-type]
    found = await asyncio.gather(*(e.image_user("img:probe-once", "sandbox") for e in engines))
    assert found == [ImageUser(1000, 1000, "/home/sandbox")] * 8
    assert probes == [("img:probe-once", "sandbox")]
    await engines[0].image_user("img:probe-once", "1000")  # another user: its own probe
    assert len(probes) == 2
