"""E2B's snapshots and forks, on the server's own (:mod:`kernel_sandbox.server.durable`).

``POST /sandboxes/{id}/snapshots`` takes a snapshot of a running sandbox (it runs on)
into the key's store, within the key's count and the server's size cap; its id
(``snapshotID``) is a template that ``POST /sandboxes`` starts a new sandbox from,
as many times as asked (files, ``$HOME`` and the kernel's variables back).
``GET /snapshots`` lists the key's (by source sandbox, by name; newest first, in pages)
and ``DELETE /templates/{snapshotID}`` deletes one (404 when the key has none of that
id: the SDK's ``False``).  ``POST /sandboxes/{id}/fork`` makes ``count`` new sandboxes
with the sandbox's state, each its own notebook.  Another key's snapshots are as
unknown as none.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from ...errors import SandboxError, SnapshotNotFoundError
from ...snapshots import Snapshot
from ..deps import Key, Opts, Ten
from ..labels import SERVER_ID_LABEL
from .control import UNSUPPORTED, _created, _error, new_record, paged, registry
from .models import NewSandbox, _In, e2b_error

__all__ = ["router"]

router = APIRouter(prefix="/e2b", tags=["e2b"])


class SnapshotRequest(_In):
    """``POST /sandboxes/{id}/snapshots``."""

    name: str | None = Field(default=None, max_length=128)
    #: False: the files only in E2B; here the kernel's variables come too, always.
    memory: bool | None = None


class ForkRequest(_In):
    """``POST /sandboxes/{id}/fork``."""

    timeout: int = Field(default=15, ge=0)
    count: int = Field(default=1, ge=1, le=64)


def _source(snap: Snapshot) -> str:
    """The server's (and E2B's) id of the sandbox a snapshot was taken of."""
    labels = snap.config.get("labels") or {}
    return str(labels.get(SERVER_ID_LABEL) or snap.sandbox_id)


def _info(snap: Snapshot) -> dict[str, Any]:
    """E2B's ``SnapshotInfo``: the id the SDK starts sandboxes from, and its names."""
    return {"snapshotID": snap.id, "names": [f"{snap.name or snap.id}:default"]}


async def _kept(ten: Any, key: str) -> list[Snapshot]:
    """The key's snapshots (not those that hold a paused sandbox), newest first."""
    snaps = [s for s in await ten.durable.store_of(key).list() if s.paused is None]
    return sorted(snaps, key=lambda s: (s.created, s.id), reverse=True)


@router.post("/sandboxes/{sandbox_id}/snapshots", response_model=None)
async def create_snapshot(
    request: Request, sandbox_id: str, body: SnapshotRequest, ten: Ten, key: Key
) -> Response:
    """Snapshot a running sandbox (201 with the snapshot's id); the sandbox runs on."""
    try:
        await registry(request).get(key, sandbox_id)  # the caller's running E2B sandbox
        async with ten.use(key, sandbox_id) as lease:
            snap = await ten.durable.snapshot(lease, body.name, tmp=False)
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse(_info(snap), status_code=201)


@router.get("/snapshots", response_model=None)
async def list_snapshots(
    ten: Ten,
    key: Key,
    sandbox_id: Annotated[str | None, Query(alias="sandboxID", max_length=100)] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=100)] = None,
) -> Response:
    """The caller's snapshots, newest first (by source sandbox, by name or id)."""
    wanted = name.rsplit(":", 1)[0] if name else None
    chosen = [
        s
        for s in await _kept(ten, key)
        if (sandbox_id is None or _source(s) == sandbox_id)
        and (wanted is None or wanted in (s.name, s.id))
    ]
    page, headers = paged(chosen, limit, next_token)
    return JSONResponse([_info(s) for s in page], headers=headers)


@router.delete("/templates/{template_id}", response_model=None)
async def delete_snapshot(request: Request, template_id: str, ten: Ten, key: Key) -> Response:
    """Delete one of the caller's snapshots (204; 404 when it has none of that id)."""
    store = ten.durable.store_of(key)
    try:
        snap = await store.get(template_id)
        if snap.paused is not None:  # a paused sandbox's: kill the sandbox instead
            raise SnapshotNotFoundError(f"no snapshot {template_id!r}")
        await store.delete(template_id)
    except SnapshotNotFoundError:
        if template_id in registry(request).templates:
            return e2b_error(501, UNSUPPORTED["templates"])
        return e2b_error(404, f"snapshot {template_id!r} not found")
    except SandboxError as exc:
        return _error(exc)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", response_model=None)
async def fork(
    request: Request, sandbox_id: str, body: ForkRequest, ten: Ten, opts: Opts, key: Key
) -> Response:
    """``count`` new sandboxes with this one's state: one result each, as E2B answers."""
    reg = registry(request)
    try:
        record, _ = await reg.get(key, sandbox_id)
        async with ten.use(key, sandbox_id) as lease:
            forks = await ten.durable.fork(lease, body.count)
    except SandboxError as exc:
        return _error(exc)
    like = NewSandbox.model_validate(
        {
            "templateID": record.template,
            "timeout": body.timeout,
            "metadata": record.metadata,
            "envVars": record.envs,
        }
    )
    try:
        made = [await new_record(reg, f, record.template, opts, like) for f in forks]
    except SandboxError as exc:  # that fork is removed; those before it stay listed
        return _error(exc)
    return JSONResponse([{"sandbox": _created(r)} for r in made], status_code=201)
