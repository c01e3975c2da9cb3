"""The /v1 routes of durable sandboxes: snapshot, restore, fork, pause, resume, list, delete.

Each acts for the caller's key only (another key's snapshot or sandbox answers 404, as
a missing one does); the work is :mod:`.durable`'s.  A snapshot is sent as its record
(:meth:`~kernel_sandbox.snapshots.Snapshot.to_json`), never its bytes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from .deps import Key, Ten
from .native import SandboxView, view

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["snapshots"])


class SnapshotRequest(BaseModel):
    """A snapshot of a live sandbox."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=200)
    exact: bool | None = None
    tmp: bool = Field(default=False, description="Save /tmp too.")


class ForkRequest(BaseModel):
    """How many forks."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=1, ge=1, le=64)


@router.post("/sandboxes/{sandbox_id}/snapshot")
async def snapshot(sandbox_id: str, body: SnapshotRequest, ten: Ten, key: Key) -> dict[str, Any]:
    """Save the sandbox's state (it runs on); the snapshot's record."""
    async with ten.use(key, sandbox_id) as lease:
        snap = await ten.durable.snapshot(lease, body.name, body.tmp, body.exact)
    return snap.to_json()


@router.post("/sandboxes/{sandbox_id}/fork", response_model=list[SandboxView])
async def fork(sandbox_id: str, body: ForkRequest, ten: Ten, key: Key) -> list[SandboxView]:
    """``n`` new sandboxes with this one's state, each with a child notebook."""
    async with ten.use(key, sandbox_id) as lease:
        forks = await ten.durable.fork(lease, body.n)
    return [view(f) for f in forks]


@router.post("/sandboxes/{sandbox_id}/pause")
async def pause(sandbox_id: str, ten: Ten, key: Key) -> dict[str, Any]:
    """Save the sandbox and remove its container; any later call resumes it (on any
    worker or replica: its calls wait, holding its call lock, until it is saved).  A
    sandbox paused already answers its pause snapshot."""
    paused = ten.paused(key, sandbox_id)
    if paused is not None:
        return paused.snapshot.to_json()
    async with ten.use(key, sandbox_id, serial=True) as lease:
        snap = await ten.durable.pause(lease)
    return snap.to_json()


@router.post("/sandboxes/{sandbox_id}/resume", response_model=SandboxView)
async def resume(sandbox_id: str, ten: Ten, key: Key) -> SandboxView:
    """Bring a paused sandbox back now (a running one is answered as it is)."""
    return view(await ten.live(key, sandbox_id))


@router.get("/snapshots")
async def list_snapshots(ten: Ten, key: Key) -> list[dict[str, Any]]:
    """The caller's snapshots (pause snapshots included), oldest first."""
    return [s.to_json() for s in await ten.durable.store_of(key).list()]


@router.get("/snapshots/{snapshot_id}")
async def get_snapshot(snapshot_id: str, ten: Ten, key: Key) -> dict[str, Any]:
    """One snapshot's record."""
    return (await ten.durable.store_of(key).get(snapshot_id)).to_json()


@router.delete("/snapshots/{snapshot_id}")
async def delete_snapshot(snapshot_id: str, ten: Ten, key: Key) -> dict[str, bool]:
    """Delete a snapshot (a pause snapshot: delete its sandbox instead)."""
    store = ten.durable.store_of(key)
    snap = await store.get(snapshot_id)
    if snap.paused is not None:
        await ten.delete(key, snap.paused)
    else:
        await store.delete(snapshot_id)
    return {"deleted": True}


@router.post("/snapshots/{snapshot_id}/restore", response_model=SandboxView)
async def restore(snapshot_id: str, ten: Ten, key: Key) -> SandboxView:
    """A new sandbox with the snapshot's state (a child notebook names its origin)."""
    return view(await ten.durable.restore(key, snapshot_id))
