"""Durable sandboxes on the server: snapshots, restore, fork, pause and auto-pause.

:class:`Durability` is the tenancy's part that keeps sandboxes beyond their
containers.  Snapshots go into one :class:`~kernel_sandbox.snapshots.LocalSnapshotStore`
(``ServerSettings.snapshot_dir``: a volume, so that they outlive the server and its
pod), each key seeing only its own (:meth:`SnapshotStore.scoped`; another key's id is
as unknown as a missing one), at most ``max_snapshots_per_key`` of them and each at most
``max_snapshot_bytes``.  A paused sandbox is nothing but its pause snapshot: the index
of paused sandboxes is rebuilt from the store when the server starts, so pauses survive
a restart or a new server pod.  The next call to a paused sandbox resumes it (same id,
variables and files back, the session notebook continued with a note).  A fork or a
restore starts a child notebook whose metadata names its parent sandbox, the snapshot
and the cell it followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CapacityError, SandboxError, SandboxNotFoundError, SnapshotNotFoundError
from ..sandbox import AsyncSandbox
from ..snapshots import LocalSnapshotStore, Snapshot, SnapshotStore
from .labels import SERVER_ID_LABEL

if TYPE_CHECKING:
    from .tenancy import Lease, Tenancy

__all__ = ["Durability", "Paused"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Paused:
    """A sandbox that has no container now: its owner, and the snapshot that holds it."""

    id: str
    owner: str
    snapshot: Snapshot


def _server_id(snap: Snapshot) -> str:
    """The server's id of the sandbox a pause snapshot holds."""
    labels = snap.config.get("labels") or {}
    return str(labels.get(SERVER_ID_LABEL) or snap.paused)


class Durability:
    """Snapshots and paused sandboxes of one server (see the module docstring)."""

    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy
        self.settings = tenancy.settings
        self.store = LocalSnapshotStore(self.settings.snapshot_dir)
        self.paused: dict[str, Paused] = {}
        self._resuming: dict[str, asyncio.Future[Lease]] = {}

    def store_of(self, owner: str) -> SnapshotStore:
        """The store as ``owner`` sees it."""
        return self.store.scoped(owner)

    async def load(self) -> None:
        """Rebuild the index of paused sandboxes from the store (at start)."""
        for snap in await self.store.list():
            if snap.paused is not None:
                sid = _server_id(snap)
                self.paused[sid] = Paused(sid, snap.owner, snap)
        if self.paused:
            log.warning("%d paused sandboxes are in the store", len(self.paused))

    async def find_paused(self, owner: str, sandbox_id: str) -> Paused | None:
        """``owner``'s sandbox ``sandbox_id`` if the store holds it paused now (several
        workers: another may have paused it, or resumed one this one saw paused)."""
        self.paused.pop(sandbox_id, None)
        for snap in await self.store_of(owner).list():
            if snap.paused is not None and _server_id(snap) == sandbox_id:
                self.paused[sandbox_id] = Paused(sandbox_id, owner, snap)
                return self.paused[sandbox_id]
        return None

    def paused_of(self, owner: str) -> list[Paused]:
        """The paused sandboxes of one key."""
        return [p for p in self.paused.values() if p.owner == owner]

    async def _room(self, owner: str) -> None:
        mine = [s for s in await self.store_of(owner).list() if s.paused is None]
        if len(mine) >= self.settings.max_snapshots_per_key:
            raise CapacityError(
                f"this key has {len(mine)} snapshots (the server keeps "
                f"{self.settings.max_snapshots_per_key} per key); delete one first"
            )

    async def snapshot(
        self, lease: Lease, name: str | None, tmp: bool, exact: bool | None = None
    ) -> Snapshot:
        """Snapshot a live sandbox of its key (within the key's count and the size cap)."""
        await self._room(lease.owner)
        snap = await lease.sandbox.snapshot(
            name,
            exact,
            store=self.store_of(lease.owner),
            tmp=tmp,
            max_bytes=self.settings.max_snapshot_bytes,
        )
        await self._keep_notebook(lease, snap)
        await asyncio.to_thread(
            lease.recorder.add_note, f"snapshot {snap.id} taken", {"snapshot": snap.id}
        )
        return snap

    async def _keep_notebook(self, lease: Lease, snap: Snapshot) -> None:
        """Put the session notebook beside the snapshot (a new server pod may lack it)."""
        await asyncio.to_thread(lease.recorder.flush)
        data = await asyncio.to_thread(Path(lease.notebook_path).read_bytes)
        writer = await self.store.writer(snap.id, "notebook")
        await writer.write(data)
        await writer.commit()

    async def pause(self, lease: Lease) -> Snapshot:
        """Save the sandbox and remove its container; the next call resumes it."""
        store = self.store_of(lease.owner)
        note = "paused: the container was removed; the next call resumes it"
        await asyncio.to_thread(lease.recorder.add_note, note)
        snap = await lease.sandbox.pause(store=store)
        await self._keep_notebook(lease, snap)
        self.paused[lease.id] = Paused(lease.id, lease.owner, snap)
        await self.tenancy.forget(lease, "paused")
        log.info("paused sandbox %s of key %s (%s)", lease.id, lease.owner, snap.id)
        return snap

    async def resume(self, owner: str, sandbox_id: str) -> Lease:
        """Bring a paused sandbox back (one resume however many calls wait for it)."""
        paused = self.paused.get(sandbox_id)
        if paused is None or paused.owner != owner:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r} for this API key")
        running = self._resuming.get(sandbox_id)
        if running is None:
            running = asyncio.ensure_future(self._resume(paused))
            self._resuming[sandbox_id] = running
            running.add_done_callback(lambda _: self._resuming.pop(sandbox_id, None))
        return await asyncio.shield(running)

    async def _resume(self, paused: Paused) -> Lease:
        snap = paused.snapshot
        store = self.store_of(paused.owner)
        notebook = self.settings.record_dir / paused.owner / f"{paused.id}.ipynb"
        if not notebook.exists():  # a new server pod: the notebook came with the snapshot
            data = b"".join([chunk async for chunk in store.read(snap.id, "notebook")])
            notebook.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(notebook.write_bytes, data)
        config = self.tenancy.config_of(snap)
        # the same sandbox again: labelled with its server id (an E2B sandbox's differs
        # from its container's), by which every worker finds it
        config = config.model_copy(update={"labels": {**config.labels, SERVER_ID_LABEL: paused.id}})
        sandbox = await AsyncSandbox.resume(str(snap.paused), store=store, **_overrides(config))
        restored = sandbox.restored
        failed = (
            f"; not restored: {', '.join(restored.failed)}" if restored and restored.failed else ""
        )
        note = f"resumed from {snap.id}: variables and files are back{failed}"
        lease = await self.tenancy.attach(sandbox, config, paused.id, paused.owner, notebook, note)
        self.paused.pop(paused.id, None)
        return lease

    async def restore(self, owner: str, snapshot_id: str, *, parent: Lease | None = None) -> Lease:
        """A new sandbox of ``owner`` from one of its snapshots, with a child notebook."""
        store = self.store_of(owner)
        snap = await store.get(snapshot_id)
        if snap.paused is not None:
            raise SnapshotNotFoundError(
                f"{snapshot_id} holds the paused sandbox {_server_id(snap)}: resume it instead"
            )
        self.tenancy.check_room(owner)
        config = self.tenancy.config_of(snap)
        sandbox = await AsyncSandbox.restore(snap, store=store, **_overrides(config))
        origin = {
            "sandbox": parent.id if parent else snap.sandbox_id,
            "snapshot": snap.id,
            "execution_count": snap.execution_count,
        }
        path = self.settings.record_dir / owner / f"{sandbox.id}.ipynb"
        note = (
            f"restored from {snap.id} (sandbox {origin['sandbox']}, after its cell "
            f"{snap.execution_count - 1})"
        )
        return await self.tenancy.attach(
            sandbox, config, sandbox.id, owner, path, note, forked_from=origin
        )

    async def fork(self, lease: Lease, n: int) -> list[Lease]:
        """``n`` new sandboxes with this one's state (one snapshot), each a child notebook."""
        if n < 1:
            raise CapacityError("fork: n must be at least 1")
        self.tenancy.check_room(lease.owner, extra=n - 1)
        snap = await self.snapshot(lease, f"fork of {lease.id}", tmp=False)
        try:
            made = await asyncio.gather(
                *(self.restore(lease.owner, snap.id, parent=lease) for _ in range(n)),
                return_exceptions=True,
            )
        finally:  # the forks hold the state: kept, it would only use up the key's count
            with contextlib.suppress(SandboxError):
                await self.store_of(lease.owner).delete(snap.id)
        forks = [m for m in made if not isinstance(m, BaseException)]
        failures = [m for m in made if isinstance(m, BaseException)]
        if failures:
            for fork in forks:
                await self.tenancy.delete(fork.owner, fork.id)
            raise failures[0]
        return forks

    async def delete_paused(self, owner: str, sandbox_id: str) -> bool:
        """Forget a paused sandbox and its snapshot (deleting a paused sandbox)."""
        paused = self.paused.get(sandbox_id)
        if paused is None or paused.owner != owner:
            return False
        self.paused.pop(sandbox_id, None)
        with contextlib.suppress(SnapshotNotFoundError):
            await self.store_of(owner).delete(paused.snapshot.id)
        return True


def _overrides(config: Any) -> dict[str, Any]:
    """The settings of a (policy-checked) server config as restore overrides."""
    from ..config import SandboxConfig

    data = config.model_dump()
    return {k: v for k, v in data.items() if k in SandboxConfig.model_fields}
