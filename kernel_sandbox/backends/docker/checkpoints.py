"""Checkpoints of gVisor sandboxes through the engine: the memory of a whole container.

Docker hands a checkpoint to the container's OCI runtime; gVisor's ``runsc`` saves
the sandbox's memory (processes, threads, open files, its in-memory file systems) by
itself, without CRIU.  The engine's checkpoint API exists only on a daemon started
with ``"experimental": true`` (Docker 20.10 to 28), and a start from a checkpoint
reads it only from the engine's own directory (``<DockerRootDir>/containers/<id>/
checkpoints/<name>``; a custom directory is refused for a start), so copying a
checkpoint out of a container or into a new one needs this process to read and write
there: root on the engine's machine.  The files are the runtime's; the host copies
them as opaque bytes and never reads what they hold.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import docker

from ...errors import SnapshotError
from ...kernel.connection import PORT_NAMES, ConnectionInfo
from ...kernel.programs import program
from .engine import run_in_thread

__all__ = [
    "BRIDGE_PIDFILE",
    "CHECKPOINT_NAME",
    "bridge_command",
    "checkpoint_dir",
    "checkpoint_support",
    "create_checkpoint",
    "delete_checkpoint",
    "start_from_checkpoint",
    "stop_bridge_command",
]

#: The one checkpoint a sandbox's container holds at a time (copied out at once).
CHECKPOINT_NAME = "kernel-sandbox"
_ID = re.compile(r"^[0-9a-f]{64}$")


def checkpoint_support(info: dict[str, Any]) -> str | None:
    """Why the engine (``docker info``) cannot take checkpoints; None if it can."""
    if not info.get("ExperimentalBuild"):
        return (
            "the Docker engine does not allow checkpoints: start it with "
            '"experimental": true in its daemon.json (scripts/setup-tiers.sh does for '
            "the dockerd it starts)"
        )
    root = Path(str(info.get("DockerRootDir") or "/nonexistent")) / "containers"
    try:
        next(root.iterdir(), None)
    except OSError as exc:
        return (
            f"this process cannot reach the engine's checkpoints ({root}: {exc.strerror}): "
            "exact snapshots need root on the engine's machine"
        )
    return None


def checkpoint_dir(info: dict[str, Any], container_id: str) -> Path:
    """Where the engine keeps the container's checkpoint (``docker info`` in ``info``)."""
    if not _ID.match(container_id):
        raise SnapshotError(f"{container_id!r} is not a full container id")
    root = Path(str(info["DockerRootDir"]))
    return root / "containers" / container_id / "checkpoints" / CHECKPOINT_NAME


def _raise(response: Any, what: str) -> None:
    try:
        response.raise_for_status()
    except Exception as exc:
        detail = getattr(response, "text", "")[-800:]
        raise SnapshotError(f"the engine could not {what}: {detail or exc}") from exc


async def create_checkpoint(api: docker.APIClient, container_id: str) -> None:
    """Checkpoint the container; it stops (its memory is in the checkpoint)."""

    def call() -> None:
        url = api._url("/containers/{0}/checkpoints", container_id)
        data = {"CheckpointID": CHECKPOINT_NAME, "Exit": True}
        _raise(api._post_json(url, data=data), "checkpoint the sandbox")

    await run_in_thread(call)


#: Starts from a checkpoint go one at a time in a process: the engine hands each
#: checkpoint to containerd's content store, where two uploads of the same bytes at once
#: (the restores of a fork) fail with "already exists"; one from another process is
#: met by a retry.
_starting = threading.Lock()
_START_ATTEMPTS = 3


async def start_from_checkpoint(api: docker.APIClient, container_id: str) -> None:
    """Start a created or stopped container from the checkpoint in its directory."""

    def call() -> None:
        url = api._url("/containers/{0}/start", container_id)
        for attempt in range(_START_ATTEMPTS):
            with _starting:
                response = api._post(url, params={"checkpoint": CHECKPOINT_NAME})
            if response.ok or "already exists" not in response.text:
                break
            time.sleep(0.2 * (attempt + 1))
        _raise(response, "restore the sandbox from its checkpoint")

    await run_in_thread(call)


async def delete_checkpoint(api: docker.APIClient, info: dict[str, Any], container_id: str) -> None:
    """Remove the container's checkpoint (the engine's record and its files)."""

    def call() -> None:
        url = api._url("/containers/{0}/checkpoints/{1}", container_id, CHECKPOINT_NAME)
        api._delete(url)
        shutil.rmtree(checkpoint_dir(info, container_id), ignore_errors=True)

    await run_in_thread(call)


#: Where the kernel's bridge notes its pid inside the sandbox (its /dev/shm: memory).
BRIDGE_PIDFILE = "/dev/shm/.kernel-sandbox-bridge"
#: Stops the bridge and waits until it is gone ($1: its pid file); nothing to stop is fine.
_STOP_BRIDGE = (
    'p=$(cat "$1" 2>/dev/null) || exit 0; rm -f "$1"; case "$p" in ""|*[!0-9]*) exit 0;; esac; '
    'kill "$p" 2>/dev/null || exit 0; '
    'i=0; while kill -0 "$p" 2>/dev/null; do i=$((i+1)); [ $i -gt 500 ] && exit 4; sleep 0.01; done'
)


def bridge_command(python: str, info: ConnectionInfo) -> list[str]:
    """Starts the kernel's bridge: each of the run directory's sockets (as the container
    sees them) carried to the kernel's socket of the same name in the abstract
    namespace, where the binder bound it (``KERNEL_SANDBOX_BRIDGED``)."""
    routes = [f"unix:{path}=unix:@{path}" for path in _socket_paths(info)]
    return [python, "-c", program("forwarder.py"), "--pidfile", BRIDGE_PIDFILE, *routes]


def stop_bridge_command() -> list[str]:
    return ["sh", "-c", _STOP_BRIDGE, "sh", BRIDGE_PIDFILE]


def _socket_paths(info: ConnectionInfo) -> list[str]:
    return [f"{info['ip']}-{info[name]}" for name in PORT_NAMES]  # type: ignore[literal-required]
