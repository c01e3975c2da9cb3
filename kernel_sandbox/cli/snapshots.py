"""``kernel-sandbox snapshot / restore / fork / pause / resume / snapshots``.

With ``--url`` (or ``$KERNEL_SANDBOX_URL``) they act on a ``kernel-sandbox serve``
server, for the key given by ``--api-key`` (or ``$KERNEL_SANDBOX_API_KEY``): its store,
its sandboxes.  Without, on this machine's sandboxes (found by id on the engine) and
the local store (``$KERNEL_SANDBOX_SNAPSHOTS``).  A sandbox a local ``restore``,
``fork`` or ``resume`` starts keeps running after the command; take it over with
``AsyncSandbox.adopt(id)`` (or ``kernel-sandbox attach``), remove it with ``gc``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from ..client import aconnect
from ..protocols import SandboxLike
from ..sandbox import AsyncSandbox
from ..snapshots import Snapshot, default_store

T = TypeVar("T")

_url = click.option("--url", envvar="KERNEL_SANDBOX_URL", help="A kernel-sandbox server.")
_key = click.option("--api-key", envvar="KERNEL_SANDBOX_API_KEY", help="The server's key.")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON records.")


def _run(work: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(work)


def _show(snap: Snapshot, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(snap.to_json(), indent=2))
        return
    click.echo(snap.summary())
    for name, reason in snap.not_saved.items():
        click.echo(f"  not saved: {name}: {reason}")


async def _keep_running(sandbox: SandboxLike) -> str:
    """Leave a sandbox running after the command; its id."""
    await sandbox.detach()
    return sandbox.id


async def _local(sandbox_id: str, own: bool) -> AsyncSandbox:
    return await AsyncSandbox.adopt(sandbox_id, own=own)


@click.command()
@click.argument("sandbox_id")
@click.option("--name", default=None, help="A name for the snapshot.")
@click.option("--tmp", is_flag=True, help="Save /tmp too.")
@click.option(
    "--exact/--portable",
    default=None,
    help="The whole memory (gVisor's checkpoint) or files and variables; default: exact "
    "where the sandbox is ready for it.",
)
@_url
@_key
@_json
def snapshot(
    sandbox_id: str,
    name: str | None,
    tmp: bool,
    exact: bool | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Save a running sandbox's state (it runs on); prints the snapshot."""

    async def work() -> Snapshot:
        if url:
            remote = await aconnect(url, sandbox_id, api_key=api_key)
            try:
                return await remote.snapshot(name, exact, tmp=tmp)
            finally:
                await remote.detach()
        sandbox = await _local(sandbox_id, own=False)
        try:
            return await sandbox.snapshot(name, exact, tmp=tmp)
        finally:
            await sandbox.close()  # a guest: only disconnects

    _show(_run(work()), as_json)


@click.command()
@click.argument("sandbox_id")
@_url
@_key
@_json
def pause(sandbox_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Save a sandbox and remove its container; `resume ID` brings it back."""

    async def work() -> Snapshot:
        if url:
            remote = await aconnect(url, sandbox_id, api_key=api_key)
            try:
                return await remote.pause()
            finally:
                await remote.detach()
        return await (await _local(sandbox_id, own=True)).pause()

    _show(_run(work()), as_json)


@click.command()
@click.argument("sandbox_id")
@_url
@_key
def resume(sandbox_id: str, url: str | None, api_key: str | None) -> None:
    """Bring a paused sandbox back under its id."""

    async def work() -> str:
        if url:
            from ..client.remote import RemoteSandbox, RemoteSnapshots

            store = RemoteSnapshots(url, api_key=api_key)
            return await _keep_running(await RemoteSandbox.resume(sandbox_id, store=store))
        return await _keep_running(await AsyncSandbox.resume(sandbox_id))

    click.echo(_run(work()))


@click.command()
@click.argument("snapshot_id")
@_url
@_key
def restore(snapshot_id: str, url: str | None, api_key: str | None) -> None:
    """Start a new sandbox with a snapshot's state; prints its id."""

    async def work() -> str:
        if url:
            from ..client.remote import RemoteSandbox, RemoteSnapshots

            store = RemoteSnapshots(url, api_key=api_key)
            return await _keep_running(await RemoteSandbox.restore(snapshot_id, store=store))
        sandbox = await AsyncSandbox.restore(snapshot_id)
        if sandbox.restored and sandbox.restored.failed:
            for name, why in sandbox.restored.failed.items():
                click.echo(f"not restored: {name}: {why}", err=True)
        return await _keep_running(sandbox)

    click.echo(_run(work()))


@click.command()
@click.argument("sandbox_id")
@click.option("-n", "count", default=1, show_default=True, type=click.IntRange(1, 64))
@_url
@_key
def fork(sandbox_id: str, count: int, url: str | None, api_key: str | None) -> None:
    """Start N new sandboxes with a running sandbox's state; prints their ids."""

    async def work() -> list[str]:
        if url:
            remote = await aconnect(url, sandbox_id, api_key=api_key)
            try:
                forks: list[Any] = list(await remote.fork(count))
            finally:
                await remote.detach()
        else:
            sandbox = await _local(sandbox_id, own=False)
            try:
                forks = list(await sandbox.fork(count))
            finally:
                await sandbox.close()
        return [await _keep_running(f) for f in forks]

    for sid in _run(work()):
        click.echo(sid)


@click.group(invoke_without_command=True)
@click.pass_context
def snapshots(ctx: click.Context) -> None:
    """List (ls, the default) or delete (rm) snapshots."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(ls)


def _store(url: str | None, api_key: str | None) -> Any:
    if url:
        from ..client.remote import RemoteSnapshots

        return RemoteSnapshots(url, api_key=api_key)
    return default_store()


@snapshots.command()
@_url
@_key
@_json
def ls(url: str | None = None, api_key: str | None = None, as_json: bool = False) -> None:
    """List snapshots (paused sandboxes marked), oldest first."""
    found = _run(_store(url, api_key).list())
    if as_json:
        click.echo(json.dumps([s.to_json() for s in found], indent=2))
    for snap in [] if as_json else found:
        paused = f"  [paused sandbox {snap.paused}]" if snap.paused else ""
        click.echo(snap.summary() + paused)
    if not found and not as_json:
        click.echo("no snapshots")


@snapshots.command()
@click.argument("snapshot_ids", nargs=-1, required=True)
@_url
@_key
def rm(snapshot_ids: tuple[str, ...], url: str | None, api_key: str | None) -> None:
    """Delete snapshots."""
    store = _store(url, api_key)

    async def work() -> None:
        for snapshot_id in snapshot_ids:
            await store.delete(snapshot_id)
            click.echo(f"deleted {snapshot_id}")

    _run(work())
