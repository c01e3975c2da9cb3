"""``kernel-sandbox ps`` and ``kernel-sandbox gc``: find and remove sandboxes by label.

Both ask the kernel host named by ``--host`` (default ``docker``) through its class
methods ``list_sandboxes`` and ``gc``, so every engine lists and cleans up its own.
"""

from __future__ import annotations

import asyncio
import time

import click

from ..backends.base import Leftover, SandboxRecord, owner_alive
from ..backends.factory import available_hosts, host_class
from ..config import LABEL_PREFIX

_HOST_OPTION = click.option(
    "--host",
    "host_name",
    default="docker",
    show_default=True,
    help=f"Kernel host to ask ({', '.join(available_hosts())}).",
)


def _sandboxes(host_name: str) -> list[SandboxRecord]:
    return asyncio.run(host_class(host_name).list_sandboxes({LABEL_PREFIX: "true"}))


@click.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="Also show stopped sandboxes.")
@_HOST_OPTION
def ps(show_all: bool, host_name: str) -> None:
    """List sandboxes with their owner process and age."""
    rows = [r for r in _sandboxes(host_name) if show_all or r.running]
    if not rows:
        click.echo("no sandboxes")
        return
    click.echo(f"{'SANDBOX':<14}{'IMAGE':<30}{'STATE':<10}{'OWNER PID':<12}{'AGE':>8}")
    for row in rows:
        alive = owner_alive(row.labels)
        owner = row.labels.get(f"{LABEL_PREFIX}.owner-pid", "?") + (
            "" if alive else " (gone)" if alive is False else " (remote)"
        )
        age = time.time() - (row.created or 0)
        click.echo(
            f"{row.sandbox_id:<14}{row.image[:29]:<30}{row.state:<10}{owner:<12}{age:>7.0f}s"
        )


async def _removed(leftover: Leftover) -> None:
    await leftover.remove()


@click.command()
@click.option(
    "--all",
    "remove_all",
    is_flag=True,
    help="Remove every sandbox, even those whose owner still runs.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@_HOST_OPTION
def gc(remove_all: bool, dry_run: bool, host_name: str) -> None:
    """Remove orphaned sandboxes (their owner process is gone), their volumes and host files.

    Only what kernel-sandbox made is touched: what carries its label and whose owner ran
    on this host (every one with ``--all``), and unclaimed host run directories.
    """
    leftovers = asyncio.run(host_class(host_name).gc(remove_all=remove_all))
    failed = 0
    for leftover in leftovers:
        click.echo(f"{'would remove' if dry_run else 'removing'} {leftover.what}")
        if not dry_run:
            try:
                asyncio.run(_removed(leftover))
            except Exception as exc:  # one wedged container must not keep the rest
                click.echo(f"could not remove {leftover.what}: {exc}", err=True)
                failed += 1
    click.echo(
        f"{len(leftovers) - failed} leftover(s) {'to remove' if dry_run else 'removed'}"
        + (f", {failed} could not be removed" if failed else "")
    )
    if failed:
        raise SystemExit(1)
