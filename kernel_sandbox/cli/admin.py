"""``kernel-sandbox ps`` and ``kernel-sandbox gc``: find and remove sandboxes by label."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import docker.errors

from .. import rundirs
from ..backends.docker import DockerBackend
from ..config import LABEL_PREFIX
from ..sandbox import runtime_root

#: Seconds before an unclaimed run directory counts as stale (its sandbox may be starting).
STALE_AFTER = 60


def _owner_alive(labels: dict[str, str]) -> bool | None:
    """Whether the process that made a sandbox still runs (None: made on another host)."""
    if labels.get(f"{LABEL_PREFIX}.owner-host") != socket.gethostname():
        return None
    try:
        os.kill(int(labels.get(f"{LABEL_PREFIX}.owner-pid", "0")), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def _sandboxes() -> list[dict[str, object]]:
    return asyncio.run(DockerBackend().list({LABEL_PREFIX: "true"}))


@click.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="Also show stopped sandboxes.")
def ps(show_all: bool) -> None:
    """List sandbox containers with their owner process and age."""
    rows = [r for r in _sandboxes() if show_all or r["state"] == "running"]
    if not rows:
        click.echo("no sandboxes")
        return
    click.echo(f"{'SANDBOX':<14}{'IMAGE':<30}{'STATE':<10}{'OWNER PID':<12}{'AGE':>8}")
    for row in rows:
        labels: dict[str, str] = row["labels"]  # type: ignore[assignment]
        alive = _owner_alive(labels)
        owner = labels.get(f"{LABEL_PREFIX}.owner-pid", "?") + (
            "" if alive else " (gone)" if alive is False else " (remote)"
        )
        age = time.time() - float(row["created"] or 0)  # type: ignore[arg-type]
        click.echo(
            f"{labels.get(f'{LABEL_PREFIX}.id', '?'):<14}{str(row['image'])[:29]:<30}"
            f"{row['state']!s:<10}{owner:<12}{age:>7.0f}s"
        )


@dataclass(frozen=True)
class _Leftover:
    """One thing gc owns and may remove: what to call it, and how to remove it."""

    what: str
    remove: Callable[[], None]


def _orphan_containers(
    backend: DockerBackend, rows: list[dict[str, object]], remove_all: bool
) -> list[_Leftover]:
    """Labelled containers of this host whose owner process is gone (all with ``--all``)."""
    found = []
    for row in rows:
        labels: dict[str, str] = row["labels"]  # type: ignore[assignment]
        if not remove_all and _owner_alive(labels) is not False:
            continue
        name = labels.get(f"{LABEL_PREFIX}.id", str(row["id"])[:12])
        run_dir = labels.get(f"{LABEL_PREFIX}.run-dir")

        def remove(container_id: str = str(row["id"]), run_dir: str | None = run_dir) -> None:
            asyncio.run(backend.remove(container_id))
            if run_dir and Path(run_dir).parent == runtime_root():
                shutil.rmtree(run_dir, ignore_errors=True)

        found.append(_Leftover(f"sandbox {name}", remove))
    return found


def _orphan_resources(
    kind: str,
    listed: list[dict[str, object]],
    remove_one: Callable[[list[str]], Coroutine[Any, Any, None]],
    remove_all: bool,
) -> list[_Leftover]:
    """Labelled volumes or networks (a sandbox's writable area, a tcp sandbox's own
    network) whose owner process is gone.

    Listed before their containers are removed and removed after them; the engine
    refuses to remove what a container still uses, which is reported, not fatal.
    """
    found = []
    for resource in listed:
        labels: dict[str, str] = resource["labels"]  # type: ignore[assignment]
        if not remove_all and _owner_alive(labels) is not False:
            continue
        name = str(resource["name"])

        def remove(name: str = name) -> None:
            try:
                asyncio.run(remove_one([name]))
            except docker.errors.APIError as exc:
                click.echo(f"left {kind} {name}: {exc.explanation or exc}")

        found.append(_Leftover(f"{kind} {name}", remove))
    return found


def _orphan_volumes(backend: DockerBackend, remove_all: bool) -> list[_Leftover]:
    volumes = asyncio.run(backend.list_volumes({LABEL_PREFIX: "true"}))
    return _orphan_resources("volume", volumes, backend.remove_volumes, remove_all)


def _orphan_networks(backend: DockerBackend, remove_all: bool) -> list[_Leftover]:
    async def remove(names: list[str]) -> None:
        for name in names:
            await backend.remove_network(name)

    networks = asyncio.run(backend.list_networks({LABEL_PREFIX: "true"}))
    return _orphan_resources("network", networks, remove, remove_all)


def _stale_run_dirs(rows: list[dict[str, object]]) -> list[_Leftover]:
    """Run directories no container of this engine refers to and no live process holds.

    A sandbox being created makes its directory before its container, and sandboxes on
    another engine share the runtime root: both hold a claim (see ``rundirs``), and a
    directory younger than ``STALE_AFTER`` is left alone in any case.
    """
    in_use = {str(r["labels"].get(f"{LABEL_PREFIX}.run-dir")) for r in rows}  # type: ignore[attr-defined]
    found = []
    for directory in sorted(runtime_root().iterdir()):
        if (
            directory.is_dir()
            and not directory.is_symlink()
            and str(directory) not in in_use
            and time.time() - directory.stat().st_mtime > STALE_AFTER
            and not rundirs.is_claimed(directory)
        ):
            found.append(
                _Leftover(
                    f"host directory {directory}",
                    functools.partial(shutil.rmtree, directory, ignore_errors=True),
                )
            )
    return found


@click.command()
@click.option(
    "--all",
    "remove_all",
    is_flag=True,
    help="Remove every sandbox, even those whose owner still runs.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
def gc(remove_all: bool, dry_run: bool) -> None:
    """Remove orphaned sandboxes (their owner process is gone), their volumes, networks, files.

    Only what kernel-sandbox made is touched: containers and volumes with its label whose
    owner ran on this host, and unclaimed directories in the runtime root.
    """
    backend = DockerBackend()
    rows = _sandboxes()
    containers = _orphan_containers(backend, rows, remove_all)
    leftovers = (
        containers
        + _orphan_volumes(backend, remove_all)
        + _orphan_networks(backend, remove_all)
        + _stale_run_dirs(rows)
    )
    failed = 0
    for leftover in leftovers:
        click.echo(f"{'would remove' if dry_run else 'removing'} {leftover.what}")
        if not dry_run:
            try:
                leftover.remove()
            except Exception as exc:  # one wedged container must not keep the rest
                click.echo(f"could not remove {leftover.what}: {exc}", err=True)
                failed += 1
    click.echo(
        f"{len(leftovers) - failed} leftover(s) {'to remove' if dry_run else 'removed'}"
        + (f", {failed} could not be removed" if failed else "")
    )
    if failed:
        raise SystemExit(1)
