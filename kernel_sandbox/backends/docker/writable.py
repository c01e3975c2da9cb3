"""The bounded writable area of a sandbox: per-sandbox in-memory volumes.

The container's root filesystem is read-only, so everything the sandbox writes lands in
one of these volumes (or in the caller's own ``volumes``) and a disk filler gets ENOSPC
at its share of ``disk_limit`` instead of filling the engine's disk.  The engine mounts
the volumes itself, so its archive API reaches them on a read-only root filesystem.
"""

from __future__ import annotations

import asyncio
import posixpath

from ...config import SandboxConfig
from .engine import DockerEngine

__all__ = ["create_writable_area", "memory_writable_area"]


async def create_writable_area(
    engine: DockerEngine,
    config: SandboxConfig,
    image: str,
    *,
    prefix: str,
    labels: dict[str, str],
    created: list[str],
) -> dict[str, dict[str, str]]:
    """Create the volumes for the working directory, $HOME and /tmp; return their binds.

    Each is sized by ``SandboxConfig.disk_budget`` and owned by the image's user
    (/dev/shm is bounded by the container spec instead).  Places that coincide share one
    volume with their shares added; a place the caller mounted a volume of their own on
    is left to it.  Every name goes into ``created`` before the engine is asked, so the
    caller can remove what exists even when this fails half-way.
    """
    budget = config.disk_budget()
    if not budget:
        return {}
    who = await engine.image_user(image, config.user)
    binds: dict[str, dict[str, str]] = {}
    creating = []
    for index, (path, (size, mode)) in enumerate(_places(config, budget, who.home)):
        name = f"{prefix}-{index}"
        created.append(name)
        creating.append(
            engine.create_volume(
                name, size=size, uid=who.uid, gid=who.gid, mode=mode, labels=labels
            )
        )
        binds[name] = {"bind": path, "mode": "rw"}
    # At once: one engine round trip's wait on every sandbox start instead of three.
    # All are awaited before a failure is raised, so none is still being made then.
    outcomes = await asyncio.gather(*creating, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return binds


async def memory_writable_area(
    engine: DockerEngine, config: SandboxConfig, image: str
) -> dict[str, str]:
    """The same places as in-memory file systems of the container (path -> options).

    For a sandbox ready for exact snapshots: under gVisor a tmpfs is the sandbox's own
    memory, so a checkpoint carries its files with the processes that have them open
    (the engine's volumes would stay behind on the host, emptied when the container
    stops).  Each is sized as its volume would be; without ``disk_limit`` they are
    bounded by ``memory_limit`` alone.
    """
    who = await engine.image_user(image, config.user)
    budget = config.disk_budget() or {"working_dir": 0, "home": 0, "tmp": 0}
    return {
        path: f"size={size},mode={mode:o},uid={who.uid},gid={who.gid}"
        if size
        else f"mode={mode:o},uid={who.uid},gid={who.gid}"
        for path, (size, mode) in _places(config, budget, who.home)
    }


def _places(
    config: SandboxConfig, budget: dict[str, int], image_home: str
) -> list[tuple[str, tuple[int, int]]]:
    """The writable places (path, (bytes, permission bits)), merged where they coincide;
    the root and places the caller mounted a volume of their own on are left out."""
    home = config.env_vars.get("HOME", image_home)
    places: dict[str, tuple[int, int]] = {}  # path -> size, permission bits
    for path, size, mode in (
        (config.working_dir, budget["working_dir"], 0o755),
        (home, budget["home"], 0o755),
        # /tmp too belongs to the sandbox user, so it can delete whatever lands there,
        # even what the engine left half-written when a file operation overflowed.
        ("/tmp", budget["tmp"], 0o1777),
    ):
        path = posixpath.normpath(path)
        known = places.get(path)
        places[path] = (size + known[0], known[1]) if known else (size, mode)
    taken = {posixpath.normpath(spec["bind"]) for spec in config.volumes.values()}
    return [(p, v) for p, v in sorted(places.items()) if p != "/" and p not in taken]
