"""The native API: everything ``AsyncSandbox`` does, over HTTP, under ``/v1``.

``POST /v1/sandboxes/{id}/python`` answers with the whole :class:`Execution` as JSON, or
with ``?stream=true`` as Server-Sent Events: one ``output`` event per nbformat output as
the kernel sends it, then one ``result`` event (the Execution).  Streamed outputs are
capped by the sandbox's ``max_output_bytes`` like the result itself.  Files go up and
down as raw bytes at ``file?path=...`` (relative paths start at the working
directory), streamed both ways (never held whole by the server) and capped by the
server's ``max_upload_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..errors import KernelError
from ..files import LIST_LIMIT
from ..results import Execution
from ..wire import dumps, to_json
from .deps import Key, Opts, Ten, json_response
from .durable import Paused
from .policy import client_config
from .settings import ServerSettings
from .tenancy import Lease, Tenancy

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["native"])
#: A path in the sandbox, as a query parameter (any name, newlines included, fits).
PathQuery = Annotated[str, Query(min_length=1, max_length=4096)]


class CreateRequest(BaseModel):
    """A new sandbox; unset fields take the server's defaults (and its limits)."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    memory_limit: str | None = None
    cpu_limit: float | None = Field(default=None, gt=0)
    disk_limit: str | None = None
    network_enabled: bool = False
    network: Literal["none", "packages", "full"] | list[str] | None = Field(
        default=None, description="The network policy wanted; lowered to the key's maximum."
    )
    env_vars: dict[str, str] = Field(default_factory=dict)
    tools: list[str] | None = None
    pool: bool = Field(default=False, description="Take a warm sandbox of the server's pool.")


class SandboxView(BaseModel):
    """A sandbox as the native API shows it."""

    id: str
    image: str
    config: dict[str, Any]
    notes: list[str]
    notebook: str
    pooled: bool = False
    #: "running", or "paused" (no container; the next call resumes it).
    status: Literal["running", "paused"] = "running"


class CodeRequest(BaseModel):
    """Code for the kernel."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(max_length=1_000_000)
    timeout: float | None = Field(default=None, gt=0)


class ShellRequest(BaseModel):
    """A shell command beside the kernel."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(max_length=1_000_000)
    timeout: float | None = Field(default=None, gt=0)
    cwd: str | None = None
    env: dict[str, str] | None = None


class PathRequest(BaseModel):
    """A path in the sandbox (relative paths start at its working directory)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(max_length=4096)


def view(lease: Lease) -> SandboxView:
    """A live sandbox as the API shows it."""
    cfg = lease.sandbox.config
    return SandboxView(
        id=lease.id,
        image=lease.sandbox.image,
        config=cfg.model_dump(mode="json", exclude={"labels", "volumes", "env_vars"}),
        notes=lease.notes,
        notebook=f"/v1/sandboxes/{lease.id}/notebook",
        pooled=lease.pooled,
    )


def paused_view(paused: Paused) -> SandboxView:
    """A paused sandbox as the API shows it (from its pause snapshot)."""
    snap = paused.snapshot
    hidden = {"labels", "volumes", "env_vars"}
    return SandboxView(
        id=paused.id,
        image=snap.image,
        config={k: v for k, v in snap.config.items() if k not in hidden},
        notes=[f"paused in snapshot {snap.id}; the next call resumes it"],
        notebook=f"/v1/sandboxes/{paused.id}/notebook",
        status="paused",
    )


def _timeout(asked: float | None, opts: ServerSettings) -> float | None:
    return None if asked is None else min(asked, opts.max_timeout)


@router.post("/sandboxes", response_model=SandboxView)
async def create(
    body: CreateRequest,
    ten: Ten,
    opts: Opts,
    key: Key,
) -> SandboxView:
    """Start a sandbox (``pool: true``: a warm one of the server's pool, when it has one)."""
    if body.pool:
        raw: dict[str, Any] = {"image": opts.default_image}
    else:
        raw = body.model_dump(exclude={"pool", "tools"}, exclude_none=True)
    raw["tools_config"] = body.tools
    cfg, notes = client_config(raw, opts, key)
    return view(await ten.create(key, cfg, "docker", notes))


@router.get("/sandboxes", response_model=list[SandboxView])
async def list_all(ten: Ten, key: Key) -> list[SandboxView]:
    """The caller's sandboxes, paused ones too."""
    paused = [paused_view(p) for p in ten.durable.paused_of(key)]
    return [*(view(lease) for lease in ten.owned(key)), *paused]


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxView)
async def get_one(sandbox_id: str, ten: Ten, key: Key) -> SandboxView:
    """One sandbox of the caller (a paused one is shown as such, not resumed)."""
    paused = ten.paused(key, sandbox_id)
    if paused is not None:
        return paused_view(paused)
    return view(ten.get(key, sandbox_id))


@router.delete("/sandboxes/{sandbox_id}")
async def delete(sandbox_id: str, ten: Ten, key: Key) -> dict[str, bool]:
    """Remove a sandbox (its notebook stays)."""
    await ten.delete(key, sandbox_id)
    return {"deleted": True}


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(data) + b"\n\n"


async def _streamed(
    ten: Tenancy, key: str, lease: Lease, body: CodeRequest, timeout: float | None
) -> AsyncIterator[bytes]:
    """Outputs as the kernel sends them, then the result; bounded like the result.

    The call runs in a task of its own that holds the sandbox (it is not reaped while
    it runs) and finishes, recorded, even if the client goes away mid-stream.
    """
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    budget = lease.sandbox.config.max_output_bytes
    dropped = 0

    shown = lease.watch_outputs(body.code)

    def on_output(output: dict[str, Any]) -> None:
        nonlocal budget, dropped
        shown(output)
        size = len(dumps(output))
        if size > budget:
            dropped += size
            return
        budget -= size
        queue.put_nowait(output)

    async def run() -> Execution:
        try:
            async with ten.use(key, lease.id) as held:
                return await held.sandbox.run_python(body.code, timeout, on_output=on_output)
        finally:
            lease.done_running()
            queue.put_nowait(None)

    task = asyncio.ensure_future(run())
    while (item := await queue.get()) is not None:
        yield _sse("output", item)
    if dropped:
        yield _sse("dropped", {"bytes": dropped})
    yield _sse("result", await task)


@router.post("/sandboxes/{sandbox_id}/python", response_model=None)
async def run_python(
    sandbox_id: str,
    body: CodeRequest,
    ten: Ten,
    opts: Opts,
    key: Key,
    stream: bool = Query(False, description="Server-Sent Events: output..., result"),
) -> Response:
    """Run code in the sandbox's persistent kernel; errors in the code are data.

    The answer is the ``Execution`` as JSON (its outputs nbformat dicts), serialised
    once, straight from the dataclass.
    """
    timeout = _timeout(body.timeout, opts)
    if not stream:
        async with ten.use(key, sandbox_id) as lease:
            shown = lease.watch_outputs(body.code)  # the live page follows the call
            try:
                return json_response(await lease.sandbox.run_python(body.code, timeout, shown))
            finally:
                lease.done_running()

    lease = await ten.live(key, sandbox_id)  # a 404 before the stream starts
    return StreamingResponse(
        _streamed(ten, key, lease, body, timeout),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


@router.post("/sandboxes/{sandbox_id}/interrupt")
async def interrupt(sandbox_id: str, ten: Ten, key: Key) -> dict[str, int]:
    """Interrupt the running cell (``KeyboardInterrupt`` in it); variables are kept."""
    lease = ten.get(key, sandbox_id)
    try:
        await lease.sandbox.interrupt()
    except KernelError:  # no kernel runs (it is being restarted): nothing to interrupt
        return {"signalled": 0}
    return {"signalled": 1}


@router.post("/sandboxes/{sandbox_id}/restart")
async def restart(sandbox_id: str, ten: Ten, key: Key) -> dict[str, bool]:
    """A fresh kernel: variables and processes end, files stay."""
    async with ten.use(key, sandbox_id) as lease:
        await lease.sandbox.restart()
    return {"restarted": True}


@router.post("/sandboxes/{sandbox_id}/shell", response_model=None)
async def run_shell(
    sandbox_id: str,
    body: ShellRequest,
    ten: Ten,
    opts: Opts,
    key: Key,
) -> Response:
    """Run a shell command beside the kernel, as the sandbox user."""
    async with ten.use(key, sandbox_id) as lease:
        done = await lease.sandbox.run_shell(
            body.command, _timeout(body.timeout, opts), cwd=body.cwd, env=body.env
        )
    return json_response(done)


@router.get("/sandboxes/{sandbox_id}/file", response_class=Response)
async def download(
    sandbox_id: str, path: PathQuery, ten: Ten, opts: Opts, key: Key
) -> StreamingResponse:
    """A file's bytes, streamed as the sandbox sends them (at most ``max_upload_bytes``).

    Refusals (no such file, too large, not readable) answer before any byte; a file
    that changes while it is sent ends the response short of its ``content-length``.
    """
    held = contextlib.AsyncExitStack()
    lease = await held.enter_async_context(ten.use(key, sandbox_id))  # not reaped meanwhile
    try:
        stream = await lease.sandbox.files.read_stream(path, opts.max_upload_bytes)
    except BaseException:
        await held.aclose()
        raise
    held.push_async_callback(stream.close)

    async def pieces() -> AsyncIterator[bytes]:
        async with held:
            async for piece in stream:
                yield piece

    return StreamingResponse(
        pieces(),
        media_type="application/octet-stream",
        headers={"content-length": str(stream.size)},
    )


@router.put("/sandboxes/{sandbox_id}/file")
async def upload(
    sandbox_id: str,
    path: PathQuery,
    request: Request,
    ten: Ten,
    opts: Opts,
    key: Key,
    append: bool = False,
) -> dict[str, int]:
    """Write the body to a file as it arrives (``?append=true`` appends).

    The body is capped (413 past ``max_upload_bytes``); it goes to a temporary file
    renamed over the target once whole, so a refused or broken upload changes nothing.
    The sandbox's listeners, its recorder among them, see the write.
    """
    async with ten.use(key, sandbox_id) as lease:
        size = await lease.sandbox.files.write_stream(
            path, request.stream(), append=append, max_bytes=opts.max_upload_bytes
        )
    return {"bytes": size}


@router.delete("/sandboxes/{sandbox_id}/file")
async def remove(sandbox_id: str, path: str, ten: Ten, key: Key) -> dict[str, bool]:
    """Remove a file or directory."""
    async with ten.use(key, sandbox_id) as lease:
        await lease.sandbox.files.remove(path)
    lease.recorder.add_file_operation("remove", path)
    return {"removed": True}


@router.get("/sandboxes/{sandbox_id}/list")
async def list_dir(
    sandbox_id: str,
    ten: Ten,
    key: Key,
    path: str = Query(".", max_length=4096),
    limit: int = Query(LIST_LIMIT, ge=1, le=LIST_LIMIT),
) -> list[dict[str, Any]]:
    """A directory listing (``FileInfo`` objects); more than ``limit`` entries: 400."""
    async with ten.use(key, sandbox_id) as lease:
        return [to_json(info) for info in await lease.sandbox.files.list(path, limit)]


@router.get("/sandboxes/{sandbox_id}/exists")
async def exists(
    sandbox_id: str,
    ten: Ten,
    key: Key,
    path: str = Query(..., max_length=4096),
) -> dict[str, bool]:
    """Whether a path exists in the sandbox."""
    async with ten.use(key, sandbox_id) as lease:
        return {"exists": await lease.sandbox.files.exists(path)}


@router.post("/sandboxes/{sandbox_id}/mkdir")
async def mkdir(sandbox_id: str, body: PathRequest, ten: Ten, key: Key) -> dict[str, bool]:
    """Create a directory (and its parents)."""
    async with ten.use(key, sandbox_id) as lease:
        await lease.sandbox.files.mkdir(body.path)
    lease.recorder.add_file_operation("mkdir", body.path)
    return {"created": True}


@router.get("/sandboxes/{sandbox_id}/notebook", response_class=FileResponse)
async def notebook(sandbox_id: str, ten: Ten, key: Key) -> FileResponse:
    """The sandbox's session so far, as a valid ``.ipynb``."""
    lease = ten.get(key, sandbox_id)
    path = lease.notebook_path
    await asyncio.to_thread(lease.recorder.flush)  # the steps still waiting to be written
    return FileResponse(path, media_type="application/x-ipynb+json", filename=f"{lease.id}.ipynb")
