"""``kernel-sandbox ps`` and ``kernel-sandbox gc``: find and remove sandboxes by label."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from pathlib import Path

import click
import docker.errors

from ..backends.docker import DockerBackend
from ..config import LABEL_PREFIX
from ..sandbox import runtime_root


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


@click.command()
@click.option(
    "--all",
    "remove_all",
    is_flag=True,
    help="Remove every sandbox, even those whose owner still runs.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
def gc(remove_all: bool, dry_run: bool) -> None:
    """Remove orphaned sandboxes (their owner process is gone), their volumes and host files."""
    backend = DockerBackend()
    removed = 0
    for row in _sandboxes():
        labels: dict[str, str] = row["labels"]  # type: ignore[assignment]
        if not remove_all and _owner_alive(labels) is not False:
            continue
        name = labels.get(f"{LABEL_PREFIX}.id", str(row["id"])[:12])
        click.echo(f"{'would remove' if dry_run else 'removing'} sandbox {name}")
        if not dry_run:
            asyncio.run(backend.remove(str(row["id"])))
            run_dir = labels.get(f"{LABEL_PREFIX}.run-dir")
            if run_dir and Path(run_dir).parent == runtime_root():
                shutil.rmtree(run_dir, ignore_errors=True)
        removed += 1
    click.echo(f"{removed} sandbox(es) {'to remove' if dry_run else 'removed'}")
    # The in-memory volumes of those sandboxes (and of any whose container is already
    # gone).  The engine refuses to remove a volume a container still uses: say so.
    volumes = [
        str(v["name"])
        for v in asyncio.run(backend.list_volumes({LABEL_PREFIX: "true"}))
        if remove_all or _owner_alive(v["labels"]) is False  # type: ignore[arg-type]
    ]
    left = 0
    for volume in volumes:
        if not dry_run:
            try:
                asyncio.run(backend.remove_volumes([volume]))
            except docker.errors.APIError as exc:
                click.echo(f"left volume {volume}: {exc.explanation or exc}")
                left += 1
    if volumes:
        done = "to remove" if dry_run else "removed"
        click.echo(f"{len(volumes) - left} volume(s) {done}")
    # Run directories no container refers to any more (their sandbox was removed by
    # hand or by the engine); young ones may belong to a sandbox that is starting.
    in_use = {str(r["labels"].get(f"{LABEL_PREFIX}.run-dir")) for r in _sandboxes()}  # type: ignore[attr-defined]
    stale = [
        d
        for d in runtime_root().iterdir()
        if d.is_dir() and str(d) not in in_use and time.time() - d.stat().st_mtime > 60
    ]
    for directory in stale:
        if not dry_run:
            shutil.rmtree(directory, ignore_errors=True)
    if stale:
        click.echo(
            f"{len(stale)} stale host directory(ies) {'to remove' if dry_run else 'removed'}"
        )
