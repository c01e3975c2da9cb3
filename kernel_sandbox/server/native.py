"""The native API: everything ``AsyncSandbox`` does, over HTTP, under ``/v1``.

``POST /v1/sandboxes/{id}/python`` answers with the whole :class:`Execution` as JSON, or
with ``?stream=true`` as Server-Sent Events: one ``output`` event per nbformat output as
the kernel sends it, then one ``result`` event (the Execution).  Streamed outputs are
capped by the sandbox's ``max_output_bytes`` like the result itself, and what waits for
a slow reader by ``STREAM_QUEUE_BYTES`` (see :func:`_streamed`).  Files go up and
down as raw bytes at ``file?path=...`` (relative paths start at the working
directory), streamed both ways (never held whole by the server) and capped by the
server's ``max_upload_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..errors import KernelError
from ..files import LIST_LIMIT
from ..limits import STREAM_QUEUE_BYTES
from ..results import Execution
from ..sandbox import AsyncSandbox
from ..wire import dumps, to_json
from .deps import Key, Opts, Ten, json_response
from .downloads import file_response
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
    exact_snapshots: bool = Field(
        default=False,
        description="Ready for exact snapshots (its whole memory; a server whose runtime "
        "is gVisor, on an engine that allows checkpoints).",
    )


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
    language: str | None = Field(
        default=None,
        max_length=64,
        description="python, r, javascript, typescript, bash: the first context of it.",
    )
    context: str | None = Field(
        default=None, max_length=64, description="A context's id (POST .../contexts)."
    )

    def run(
        self, sandbox: AsyncSandbox, timeout: float | None, on_output: Any, default: str | None
    ) -> Awaitable[Execution]:
        """The call on ``sandbox`` (``default``: the language when none is given)."""
        language = self.language or (default if self.context is None else None)
        return sandbox.run_code(
            self.code, language, context=self.context, timeout=timeout, on_output=on_output
        )


class ContextRequest(BaseModel):
    """Another kernel in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    language: str | None = Field(default=None, max_length=64)
    kernel: str | None = Field(default=None, max_length=64, description="A kernelspec name.")
    cwd: str | None = Field(default=None, max_length=4096)


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
    return [*(view(lease) for lease in await ten.everyone(key)), *paused]


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxView)
async def get_one(sandbox_id: str, ten: Ten, key: Key) -> SandboxView:
    """One sandbox of the caller (a paused one is shown as such, not resumed)."""
    paused = ten.paused(key, sandbox_id)
    if paused is not None:
        return paused_view(paused)
    return view(await ten.live(key, sandbox_id))


@router.delete("/sandboxes/{sandbox_id}")
async def delete(sandbox_id: str, ten: Ten, key: Key) -> dict[str, bool]:
    """Remove a sandbox (its notebook stays)."""
    await ten.delete(key, sandbox_id)
    return {"deleted": True}


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(data) + b"\n\n"


async def _streamed(
    ten: Tenancy,
    key: str,
    lease: Lease,
    body: CodeRequest,
    timeout: float | None,
    default: str | None,
) -> AsyncIterator[bytes]:
    """Outputs as the kernel sends them, then the result; bounded like the result.

    The call runs in a task of its own that holds the sandbox (it is not reaped while
    it runs) and finishes, recorded, even if the client goes away mid-stream.  A reader
    slower than the kernel costs its own stream, never the server's memory: at most
    ``STREAM_QUEUE_BYTES`` of events wait for it; outputs past that are dropped from
    the stream (a ``dropped`` event counts them before the result) while the ``result``
    event still carries every output, within ``max_output_bytes``.  A reader that left
    stops the queueing at once.
    """
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    budget = lease.sandbox.config.max_output_bytes
    waiting = 0  # bytes queued for the reader
    dropped = dropped_outputs = 0
    gone = False

    shown = lease.watch_outputs(body.code)

    def on_output(output: dict[str, Any]) -> None:
        nonlocal budget, waiting, dropped, dropped_outputs
        shown(output)
        if gone:
            return
        event = _sse("output", output)
        if len(event) > budget or waiting + len(event) > STREAM_QUEUE_BYTES:
            dropped += len(event)
            dropped_outputs += 1
            return
        budget -= len(event)
        waiting += len(event)
        queue.put_nowait(event)

    async def run() -> Execution:
        try:
            async with ten.use(key, lease.id, serial=True) as held:
                return await body.run(held.sandbox, timeout, on_output, default)
        finally:
            lease.done_running()
            queue.put_nowait(None)

    task = asyncio.ensure_future(run())
    try:
        while (item := await queue.get()) is not None:
            waiting -= len(item)
            yield item
        if dropped:
            yield _sse("dropped", {"bytes": dropped, "outputs": dropped_outputs})
        yield _sse("result", await task)
    finally:
        gone = True
        while not queue.empty():  # what the reader left behind is freed now
            queue.get_nowait()


@router.post("/sandboxes/{sandbox_id}/python", response_model=None)
async def run_python(
    sandbox_id: str,
    body: CodeRequest,
    ten: Ten,
    opts: Opts,
    key: Key,
    stream: bool = Query(False, description="Server-Sent Events: output..., result"),
) -> Response:
    """Run code in the sandbox's persistent python kernel (or ``language``/``context``);
    errors in the code are data.

    The answer is the ``Execution`` as JSON (its outputs nbformat dicts), serialised
    once, straight from the dataclass.
    """
    return await _run(sandbox_id, body, ten, opts, key, stream, "python")


@router.post("/sandboxes/{sandbox_id}/code", response_model=None)
async def run_code(
    sandbox_id: str,
    body: CodeRequest,
    ten: Ten,
    opts: Opts,
    key: Key,
    stream: bool = Query(False, description="Server-Sent Events: output..., result"),
) -> Response:
    """Run code in a kernel of the sandbox: ``context`` (an id), else the first context
    of ``language``, else the sandbox's own kernel; answered as ``.../python`` is."""
    return await _run(sandbox_id, body, ten, opts, key, stream, None)


async def _run(
    sandbox_id: str,
    body: CodeRequest,
    ten: Tenancy,
    opts: ServerSettings,
    key: str,
    stream: bool,
    default: str | None,
) -> Response:
    timeout = _timeout(body.timeout, opts)
    if not stream:
        async with ten.use(key, sandbox_id, serial=True) as lease:
            shown = lease.watch_outputs(body.code)  # the live page follows the call
            try:
                return json_response(await body.run(lease.sandbox, timeout, shown, default))
            finally:
                lease.done_running()

    lease = await ten.live(key, sandbox_id)  # a 404 before the stream starts
    return StreamingResponse(
        _streamed(ten, key, lease, body, timeout, default),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


@router.get("/sandboxes/{sandbox_id}/kernels")
async def kernels(sandbox_id: str, ten: Ten, key: Key) -> dict[str, Any]:
    """The Jupyter kernels the sandbox's image holds, by kernelspec name."""
    async with ten.use(key, sandbox_id) as lease:
        specs = await lease.sandbox.kernelspecs()
    return {name: dataclasses.asdict(spec) for name, spec in specs.items()}


@router.get("/sandboxes/{sandbox_id}/contexts")
async def list_contexts(sandbox_id: str, ten: Ten, key: Key) -> list[dict[str, Any]]:
    """The sandbox's kernels: its own (``default``) and every context made since."""
    lease = await ten.live(key, sandbox_id)
    return [dataclasses.asdict(c) for c in lease.sandbox.list_contexts()]


@router.post("/sandboxes/{sandbox_id}/contexts")
async def create_context(
    sandbox_id: str, body: ContextRequest, ten: Ten, key: Key
) -> dict[str, Any]:
    """Start another kernel in the sandbox (same files, its own variables)."""
    async with ten.use(key, sandbox_id) as lease:
        made = await lease.sandbox.create_context(body.language, kernel=body.kernel, cwd=body.cwd)
    return dataclasses.asdict(made)


@router.post("/sandboxes/{sandbox_id}/contexts/{context_id}/restart")
async def restart_context(sandbox_id: str, context_id: str, ten: Ten, key: Key) -> dict[str, bool]:
    """A fresh kernel for one context: its variables end, files and other contexts stay."""
    async with ten.use(key, sandbox_id) as lease:
        await lease.sandbox.restart_context(context_id)
    return {"restarted": True}


@router.delete("/sandboxes/{sandbox_id}/contexts/{context_id}")
async def remove_context(sandbox_id: str, context_id: str, ten: Ten, key: Key) -> dict[str, bool]:
    """End a context's kernel (not the default one: delete the sandbox for that)."""
    async with ten.use(key, sandbox_id) as lease:
        await lease.sandbox.remove_context(context_id)
    return {"removed": True}


@router.post("/sandboxes/{sandbox_id}/interrupt")
async def interrupt(
    sandbox_id: str,
    ten: Ten,
    key: Key,
    context: str | None = Query(None, max_length=64, description="A context's id."),
) -> dict[str, int]:
    """Interrupt the running cell (``KeyboardInterrupt`` in it); variables are kept."""
    lease = await ten.live(key, sandbox_id)
    try:
        await lease.sandbox.interrupt(context)
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
    async with ten.use(key, sandbox_id, serial=True) as lease:
        done = await lease.sandbox.run_shell(
            body.command, _timeout(body.timeout, opts), cwd=body.cwd, env=body.env
        )
    return json_response(done)


@router.get("/sandboxes/{sandbox_id}/file", response_class=Response)
async def download(sandbox_id: str, path: PathQuery, ten: Ten, opts: Opts, key: Key) -> Response:
    """A file's bytes (at most ``max_upload_bytes``), see :mod:`.downloads`.

    Refusals (no such file, too large, not readable) answer before any byte; a large
    file that changes while it is sent ends the response short of its ``content-length``.
    """
    held = contextlib.AsyncExitStack()
    lease = await held.enter_async_context(ten.use(key, sandbox_id))  # not reaped meanwhile
    try:
        stream = await lease.sandbox.files.read_stream(path, opts.max_upload_bytes)
    except BaseException:
        await held.aclose()
        raise
    held.push_async_callback(stream.close)
    return await file_response(stream, held)


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
    lease = await ten.live(key, sandbox_id)
    path = lease.notebook_path
    # the steps still waiting to be written, also another worker's (see Tenancy._called)
    await asyncio.to_thread(lease.recorder.settle)
    return FileResponse(path, media_type="application/x-ipynb+json", filename=f"{lease.id}.ipynb")
