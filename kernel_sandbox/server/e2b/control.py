"""E2B's control API under ``/e2b``: create, connect, list, kill, timeouts, metrics.

The same keys, tenancy and limits as every other route: ``E2B_API_KEY`` is one of the
server's API keys (sent as ``X-API-Key``), a sandbox is a lease of the tenancy (so it
is recorded as a notebook and shows on ``/v1``), another key's sandbox answers 404.
Templates name images by the server's setting (``--e2b-template NAME=IMAGE``;
``base`` and ``code-interpreter-v1`` are the default image).  What this server does
not have — template builds, volumes, teams, network updates — answers in E2B's error
shape, 501, saying so.  Snapshots and forks are the server's own (:mod:`.snapshots`);
a snapshot's id is a template that starts a sandbox from it.
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol, TypeVar

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from ...config import parse_size
from ...errors import SandboxError
from ...kernel.programs import program
from ...limits import E2B_MAX_TIMEOUT
from ..deps import Key, Opts, Ten, status_of
from ..policy import client_config
from ..tenancy import Lease
from .metrics import between, sample
from .models import (
    ConnectRequest,
    ListedSandbox,
    NewSandbox,
    SandboxCreated,
    SandboxDetail,
    TimeoutRequest,
    e2b_error,
    iso,
)
from .state import E2bRegistry, E2bSandbox, new_id

__all__ = ["UNSUPPORTED", "new_record", "paged", "registry", "router"]

router = APIRouter(prefix="/e2b", tags=["e2b"])

#: Working directory (and E2B's home) of sandboxes made through this API.
E2B_HOME = "/home/user"
#: Run by every start of an E2B sandbox's python kernels (see the program's docstring).
DISPLAY = program("e2b_display.py")

#: Why each E2B feature this server has not is missing (answered with 501).
UNSUPPORTED = {
    "templates": "template building is not supported here: templates name images the "
    "server's operator configured (kernel-sandbox serve --e2b-template NAME=IMAGE)",
    "volumes": "E2B volumes are not supported by this server",
    "teams": "teams are not supported by this server: each API key is one tenant",
    "network": "changing a running sandbox's network is not supported: the server's "
    "policy decides it at create",
    "logs": "sandbox logs are not served: the session is recorded as a notebook "
    "(GET /v1/sandboxes/{id}/notebook)",
}


def registry(request: Request) -> E2bRegistry:
    """The app's E2B registry."""
    return request.app.state.e2b  # type: ignore[no-any-return]


def _error(exc: SandboxError) -> JSONResponse:
    status = status_of(exc)
    return e2b_error(status, str(exc))


def _created(record: E2bSandbox) -> dict[str, Any]:
    return SandboxCreated(
        template_id=record.template,
        sandbox_id=record.id,
        client_id="kernel-sandbox",
        envd_access_token=record.access_token,
    ).model_dump(exclude_none=True)


def _listed(record: E2bSandbox) -> ListedSandbox:
    return ListedSandbox(
        template_id=record.template,
        sandbox_id=record.id,
        client_id="kernel-sandbox",
        started_at=iso(record.started_at),
        end_at=iso(record.end_at),
        cpu_count=record.cpu_count,
        memory_mb=record.memory_mb,
        disk_size_mb=record.disk_mb,
        metadata=record.metadata,
        state="paused" if record.paused else "running",
    )


def _clamped(timeout: float) -> float:
    return min(float(timeout), E2B_MAX_TIMEOUT)


async def _create(request: Request, body: NewSandbox, ten: Ten, opts: Opts, key: Key) -> Response:
    reg = registry(request)
    image = reg.templates.get(body.template_id)
    if image is None:
        return await _from_snapshot(request, body, ten, opts, key)
    if body.volume_mounts:
        return e2b_error(501, UNSUPPORTED["volumes"])
    raw = {
        "image": image,
        "working_dir": E2B_HOME,
        # E2B's display conventions in its python kernels (DataFrame columns, charts)
        "env_vars": {**body.env_vars, "KERNEL_SANDBOX_STARTUP": DISPLAY},
        "network": "full" if body.allow_internet_access is not False else "none",
    }
    try:
        cfg, notes = client_config(raw, opts, key)
        sandbox_id = new_id()
        notes.append(f"E2B template {body.template_id}")
        lease = await ten.create(key, cfg, "e2b", notes, sandbox_id)
        record = await new_record(reg, lease, body.template_id, opts, body)
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse(_created(record), status_code=201)


async def _from_snapshot(
    request: Request, body: NewSandbox, ten: Ten, opts: Opts, key: Key
) -> Response:
    """A template that names none of the server's is one of the key's snapshots, or
    unknown (404)."""
    reg = registry(request)
    try:
        snap = await ten.durable.store_of(key).get(body.template_id)
    except SandboxError:
        snap = None
    if snap is None or snap.paused is not None:
        known = ", ".join(sorted(reg.templates))
        return e2b_error(
            404,
            f"template {body.template_id!r} not found: this server maps templates to "
            f"images with --e2b-template NAME=IMAGE (known: {known}); a snapshot's id "
            "starts a sandbox from it",
        )
    try:
        lease = await ten.durable.restore(key, snap.id)
        record = await new_record(reg, lease, body.template_id, opts, body)
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse(_created(record), status_code=201)


async def new_record(
    reg: E2bRegistry, lease: Lease, template: str, opts: Any, body: NewSandbox
) -> E2bSandbox:
    """The E2B record of a sandbox just made for ``body``'s caller (kept in ``reg``; the
    sandbox is removed again when its record cannot be kept)."""
    config = lease.sandbox.config
    disk = parse_size(config.disk_limit) if config.disk_limit else parse_size(opts.max_disk)
    record = E2bSandbox(
        id=lease.id,
        owner=lease.owner,
        template=template,
        metadata=dict(body.metadata),
        envs=dict(body.env_vars),
        cpu_count=max(1, round(config.cpu_limit)),
        memory_mb=parse_size(config.memory_limit) // 2**20,
        disk_mb=disk // 2**20,
        end_at=time.time() + _clamped(body.timeout),
        on_timeout="pause" if body.auto_pause else "kill",
    )
    await reg.add(record)
    return record


@router.post("/sandboxes", response_model=None)
async def create(request: Request, body: NewSandbox, ten: Ten, opts: Opts, key: Key) -> Response:
    """Start a sandbox from a template (``201`` with its id and envd access token)."""
    return await _create(request, body, ten, opts, key)


@router.post("/v2/sandboxes", response_model=None)
async def create_v2(request: Request, body: NewSandbox, ten: Ten, opts: Opts, key: Key) -> Response:
    """``POST /sandboxes`` as the SDK's current version sends it."""
    return await _create(request, body, ten, opts, key)


def _metadata_filter(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    return {
        urllib.parse.unquote(k): urllib.parse.unquote(v)
        for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True)
    }


@dataclass(frozen=True)
class Listing:
    """What a listing asks for: metadata and state filters, order, a page."""

    metadata: str | None = None
    state: str | None = None
    limit: int = 10_000
    next_token: str | None = None
    #: newest first (E2B's default) or oldest first
    order: Literal["asc", "desc"] = "desc"
    started_after: datetime | None = None
    template: str | None = None


def _listing(request: Request, key: str, ask: Listing) -> Response:
    wanted = _metadata_filter(ask.metadata)
    states = {s.strip() for s in ask.state.split(",")} if ask.state else {"running", "paused"}
    after = ask.started_after
    if after is not None and after.tzinfo is None:
        after = after.replace(tzinfo=UTC)
    records = sorted(
        registry(request).owned(key),
        key=lambda r: (r.started_at, r.id),
        reverse=ask.order == "desc",
    )
    chosen = [
        r
        for r in records
        if ("paused" if r.paused else "running") in states
        and all(r.metadata.get(k) == v for k, v in wanted.items())
        and (after is None or datetime.fromtimestamp(r.started_at, UTC) >= after)
        and (ask.template is None or r.template == ask.template)
    ]
    page, headers = paged(chosen, ask.limit, ask.next_token)
    body = [_listed(r).model_dump(exclude_none=True) for r in page]
    return JSONResponse(body, headers=headers)


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=_HasId)


def paged(
    items: list[Item], limit: int, next_token: str | None
) -> tuple[list[Item], dict[str, str]]:
    """E2B's pages: ``limit`` items from the one ``next_token`` names, and the header
    naming the next page's first (none on the last page)."""
    start = 0
    if next_token:
        start = next((i for i, item in enumerate(items) if item.id == next_token), len(items))
    headers = {}
    if start + limit < len(items):
        headers["x-next-token"] = items[start + limit].id
    return items[start : start + limit], headers


@router.get("/v2/sandboxes", response_model=None)
async def list_v2(
    request: Request,
    key: Key,
    metadata: Annotated[str | None, Query(max_length=10_000)] = None,
    state: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=100)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    started_after: Annotated[datetime | None, Query(alias="startedAfter")] = None,
    template: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """The caller's sandboxes (metadata, states, start time and template filters; newest
    first unless ``order=asc``; pages of ``limit``)."""
    ask = Listing(metadata, state, limit, next_token, order, started_after, template)
    return _listing(request, key, ask)


@router.get("/sandboxes", response_model=None)
async def list_v1(
    request: Request,
    key: Key,
    metadata: Annotated[str | None, Query(max_length=10_000)] = None,
) -> Response:
    """The caller's running sandboxes (E2B's first listing)."""
    return _listing(request, key, Listing(metadata, "running"))


@router.get("/sandboxes/{sandbox_id}", response_model=None)
async def get_one(request: Request, sandbox_id: str, key: Key) -> Response:
    """One sandbox of the caller, with its envd access token."""
    try:
        record = await registry(request).record(key, sandbox_id)
    except SandboxError as exc:
        return _error(exc)
    listed = _listed(record).model_dump(by_alias=False)
    detail = SandboxDetail(**listed, envd_access_token=record.access_token)
    return JSONResponse(detail.model_dump(exclude_none=True))


@router.delete("/sandboxes/{sandbox_id}", response_model=None)
async def kill(request: Request, sandbox_id: str, key: Key) -> Response:
    """Remove a sandbox (its notebook stays)."""
    reg = registry(request)
    try:
        record = await reg.record(key, sandbox_id)
    except SandboxError as exc:
        return _error(exc)
    await reg.kill(record)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", response_model=None)
async def set_timeout(
    request: Request, sandbox_id: str, body: TimeoutRequest, key: Key
) -> Response:
    """The sandbox ends ``timeout`` seconds from now (longer or shorter than before)."""
    reg = registry(request)
    try:
        record, _ = await reg.get(key, sandbox_id)
    except SandboxError as exc:
        return _error(exc)
    reg.ends_at(record, time.time() + _clamped(body.timeout))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", response_model=None)
async def refresh(request: Request, sandbox_id: str, key: Key) -> Response:
    """Keep a sandbox alive a while longer (E2B's keep-alive; at least 15 s more)."""
    reg = registry(request)
    try:
        record, _ = await reg.get(key, sandbox_id)
    except SandboxError as exc:
        return _error(exc)
    reg.ends_at(record, max(record.end_at, time.time() + 15))
    return Response(status_code=204)


async def _connect(request: Request, sandbox_id: str, body: ConnectRequest, key: str) -> Response:
    """Connect to a running sandbox (200), or resume a paused one (201)."""
    reg = registry(request)
    try:
        record = await reg.record(key, sandbox_id)
        if record.paused:
            await reg.resume(record, _clamped(body.timeout if body.timeout is not None else 300))
            return JSONResponse(_created(record), status_code=201)
    except SandboxError as exc:
        return _error(exc)
    if body.timeout is not None:  # a running sandbox's timeout only grows
        reg.ends_at(record, max(record.end_at, time.time() + _clamped(body.timeout)))
    return JSONResponse(_created(record), status_code=200)


@router.post("/sandboxes/{sandbox_id}/pause", response_model=None)
async def pause(request: Request, sandbox_id: str, key: Key) -> Response:
    """Pause a sandbox: files and variables saved, its container removed (409 if it is
    paused already); connect resumes it under the same id."""
    reg = registry(request)
    try:
        record = await reg.record(key, sandbox_id)
        if record.paused:
            return e2b_error(409, f"sandbox {sandbox_id} is paused already")
        await reg.pause(record)
    except SandboxError as exc:
        return _error(exc)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/resume", response_model=None)
async def resume(request: Request, sandbox_id: str, body: ConnectRequest, key: Key) -> Response:
    """Resume a paused sandbox (E2B's older route; connect does the same)."""
    reg = registry(request)
    try:
        record = await reg.record(key, sandbox_id)
        if not record.paused:
            return e2b_error(409, f"sandbox {sandbox_id} is running, not paused")
        await reg.resume(record, _clamped(body.timeout if body.timeout is not None else 300))
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse(_created(record), status_code=201)


@router.post("/sandboxes/{sandbox_id}/connect", response_model=None)
async def connect(request: Request, sandbox_id: str, body: ConnectRequest, key: Key) -> Response:
    """Connect to a running sandbox (its timeout may grow)."""
    return await _connect(request, sandbox_id, body, key)


@router.post("/v2/sandboxes/{sandbox_id}/connect", response_model=None)
async def connect_v2(request: Request, sandbox_id: str, body: ConnectRequest, key: Key) -> Response:
    """``connect`` as the SDK's current version sends it."""
    return await _connect(request, sandbox_id, body, key)


@router.get("/sandboxes/{sandbox_id}/metrics", response_model=None)
async def metrics(
    request: Request,
    sandbox_id: str,
    ten: Ten,
    key: Key,
    start: Annotated[int | None, Query(ge=0)] = None,
    end: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """CPU, memory and disk of the sandbox between ``start`` and ``end`` (unix seconds;
    default: since it started, until now).  Samples are measured inside the sandbox when
    asked: a range that reaches the present takes one now; the sandbox keeps the last
    ``E2B_METRICS_SAMPLES`` of them for later ranges."""
    try:
        record, lease = await registry(request).get(key, sandbox_id)
        now = time.time()
        fresh = None
        # the range's end is whole seconds: the present is in it until the next second
        if (end is None or end + 1 >= now) and (start is None or start <= now):
            async with ten.use(key, lease.id):
                fresh = await sample(lease.sandbox, record.cpu_count)
            record.samples.append(fresh)
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse([s.model_dump() for s in between(record.samples, start, end, fresh)])


@router.get("/health", response_model=None)
async def health() -> Response:
    """The control API answers (E2B's health check)."""
    return JSONResponse({"status": "ok"})


def _unsupported(what: str) -> Any:
    async def answer(request: Request) -> Response:
        return e2b_error(501, UNSUPPORTED[what])

    answer.__doc__ = f"Not supported here: {UNSUPPORTED[what]}."
    return answer


_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]
for _path, _what in [
    ("/sandboxes/{sandbox_id}/network", "network"),
    ("/sandboxes/{sandbox_id}/logs", "logs"),
    ("/v2/sandboxes/{sandbox_id}/logs", "logs"),
    ("/templates", "templates"),
    ("/templates/{rest:path}", "templates"),
    ("/v2/templates", "templates"),
    ("/v2/templates/{rest:path}", "templates"),
    ("/v3/templates", "templates"),
    ("/volumes", "volumes"),
    ("/volumes/{rest:path}", "volumes"),
    ("/teams", "teams"),
    ("/teams/{rest:path}", "teams"),
]:
    router.add_api_route(_path, _unsupported(_what), methods=_ANY, include_in_schema=False)
