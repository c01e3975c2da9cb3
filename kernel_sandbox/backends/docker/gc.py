"""What ``kernel-sandbox gc`` removes on Docker: orphaned containers, volumes, networks,
and host run directories.

Only what kernel_sandbox made is touched: containers and volumes with its label whose
owner process ran on this host and is gone (everything with ``remove_all``), and
unclaimed directories in the runtime root.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import docker.errors

from ... import rundirs
from ...config import LABEL_PREFIX
from ...errors import SandboxError
from ...threads import in_thread
from ..base import Leftover, SandboxRecord, owner_alive
from .engine import DockerEngine

__all__ = ["STALE_AFTER", "find_leftovers", "remove_labelled"]

log = logging.getLogger(__name__)

#: Seconds before an unclaimed run directory counts as stale (its sandbox may be starting).
STALE_AFTER = 60


async def find_leftovers(engine: DockerEngine, *, remove_all: bool = False) -> list[Leftover]:
    """Containers first, then their volumes (in use until they go), then run directories.

    Volumes and networks of a sandbox whose container is kept (its owner lives, or a
    live process adopted it) are kept with it.
    """
    rows = await engine.list({LABEL_PREFIX: "true"})
    kept = frozenset() if remove_all else _kept_sandboxes(rows)
    return (
        _orphan_containers(engine, rows, kept)
        + await _orphan_volumes(engine, remove_all, kept)
        + await _orphan_networks(engine, remove_all, kept)
        + _stale_run_dirs(rows)
    )


def _kept_sandboxes(rows: list[SandboxRecord]) -> frozenset[str]:
    """Ids of the sandboxes whose owner may live (here, or on another host) or that a
    live process here adopted."""
    return frozenset(
        row.labels.get(f"{LABEL_PREFIX}.id", row.resource_id)
        for row in rows
        if owner_alive(row.labels) is not False or _adopted(row.labels)
    )


def _orphan_containers(
    engine: DockerEngine, rows: list[SandboxRecord], kept: frozenset[str]
) -> list[Leftover]:
    found = []
    for row in rows:
        run_dir = row.labels.get(f"{LABEL_PREFIX}.run-dir")
        if row.labels.get(f"{LABEL_PREFIX}.id", row.resource_id) in kept:
            continue

        async def remove(
            container_id: str = row.resource_id, run_dir: str | None = run_dir
        ) -> None:
            await _remove_container(engine, container_id, run_dir)

        name = row.labels.get(f"{LABEL_PREFIX}.id", row.resource_id[:12])
        found.append(Leftover(f"sandbox {name}", remove))
    return found


async def _remove_container(engine: DockerEngine, container_id: str, run_dir: str | None) -> None:
    """Remove a sandbox's container, then its run directory (only one in the runtime
    root: a label names it, and labels are not to be trusted further)."""
    await engine.remove(container_id)
    if run_dir and Path(run_dir).parent == rundirs.runtime_root():
        await in_thread(shutil.rmtree, run_dir, True)


def _adopted(labels: dict[str, str]) -> bool:
    """A live process adopted the sandbox (its labels still name the dead first owner):
    it holds the claim on the run directory (``ipc``) or on its adoption directory."""
    run_dir = labels.get(f"{LABEL_PREFIX}.run-dir")
    if run_dir and Path(run_dir).parent == rundirs.runtime_root():
        return rundirs.is_claimed(Path(run_dir))
    marker = rundirs.adoption_dir(labels.get(f"{LABEL_PREFIX}.id", ""))
    return marker is not None and rundirs.is_claimed(marker)


def _orphan_resources(
    kind: str,
    listed: list[dict[str, object]],
    remove_one: Callable[[str], Awaitable[None]],
    remove_all: bool,
    kept: frozenset[str],
) -> list[Leftover]:
    """Labelled volumes or networks (a sandbox's writable area, a tcp sandbox's own
    network) whose owner process is gone and whose sandbox is not kept.

    Removed after the containers: the engine refuses to remove what a container still
    uses, which is reported, not fatal.
    """
    found = []
    for resource in listed:
        labels: dict[str, str] = resource["labels"]  # type: ignore[assignment]
        if not remove_all and (
            owner_alive(labels) is not False or labels.get(f"{LABEL_PREFIX}.id") in kept
        ):
            continue
        name = str(resource["name"])

        async def remove(name: str = name) -> None:
            try:
                await remove_one(name)
            except docker.errors.APIError as exc:
                raise SandboxError(f"the engine keeps it: {exc.explanation or exc}") from exc

        found.append(Leftover(f"{kind} {name}", remove))
    return found


async def _orphan_volumes(
    engine: DockerEngine, remove_all: bool, kept: frozenset[str]
) -> list[Leftover]:
    async def remove(name: str) -> None:
        await engine.remove_volumes([name])

    volumes = await engine.list_volumes({LABEL_PREFIX: "true"})
    return _orphan_resources("volume", volumes, remove, remove_all, kept)


async def _orphan_networks(
    engine: DockerEngine, remove_all: bool, kept: frozenset[str]
) -> list[Leftover]:
    networks = await engine.list_networks({LABEL_PREFIX: "true"})
    return _orphan_resources("network", networks, engine.remove_network, remove_all, kept)


def _stale_run_dirs(rows: list[SandboxRecord]) -> list[Leftover]:
    """Run directories no container of this engine refers to and no live process holds.

    A sandbox being created makes its directory before its container, and sandboxes on
    another engine share the runtime root: both hold a claim (see ``rundirs``), and a
    directory younger than ``STALE_AFTER`` is left alone in any case.
    """
    in_use = {row.labels.get(f"{LABEL_PREFIX}.run-dir") for row in rows}
    found = []
    for directory in sorted(rundirs.runtime_root().iterdir()):
        if (
            directory.is_dir()
            and not directory.is_symlink()
            and str(directory) not in in_use
            and time.time() - directory.stat().st_mtime > STALE_AFTER
            and not rundirs.is_claimed(directory)
        ):

            async def remove(directory: Path = directory) -> None:
                await in_thread(shutil.rmtree, directory, ignore_errors=True)

            found.append(Leftover(f"host directory {directory}", remove))
    return found


async def remove_labelled(
    engine: DockerEngine, labels: dict[str, str], keep: frozenset[str] = frozenset()
) -> int:
    """Remove the containers carrying ``labels`` (except sandbox ids in ``keep``) with
    their volumes, networks and run directories; count the containers.

    One that cannot be removed is logged and skipped (a server starting must not stop
    at one wedged container).
    """
    id_label = f"{LABEL_PREFIX}.id"
    rows = [row for row in await engine.list(labels) if row.labels.get(id_label) not in keep]
    volumes = [
        str(v["name"])
        for v in await engine.list_volumes(labels)
        if v["labels"].get(id_label) not in keep  # type: ignore[attr-defined]
    ]
    for row in rows:
        try:
            await _remove_container(
                engine, row.resource_id, row.labels.get(f"{LABEL_PREFIX}.run-dir")
            )
        except Exception as exc:
            log.warning("could not remove leftover container %s: %s", row.resource_id, exc)
    if volumes:
        try:
            await engine.remove_volumes(volumes)
        except Exception as exc:
            log.warning("could not remove leftover volumes: %s", exc)
    for network in await engine.list_networks(labels):
        if network["labels"].get(id_label) in keep:  # type: ignore[attr-defined]
            continue
        try:
            await engine.remove_network(str(network["name"]))
        except Exception as exc:
            log.warning("could not remove leftover network %s: %s", network["name"], exc)
    return len(rows)
