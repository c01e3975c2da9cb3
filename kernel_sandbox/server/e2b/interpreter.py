"""The code interpreter's routes (E2B port 49999): ``POST /execute`` and ``/contexts``.

``/execute`` runs code in the sandbox's persistent kernel (``run_python``, so every
call is recorded in the session's notebook like any other) and streams NDJSON lines
as the kernel sends outputs: ``stdout``/``stderr`` text, ``result`` objects (text,
html, markdown, svg, png, jpeg, pdf, latex, json, javascript; ``is_main_result`` for
the last expression's value, other MIME types under ``extra``), an ``error`` (name,
value, traceback), then ``number_of_executions``.  Streamed outputs are capped by the
sandbox's ``max_output_bytes``.  A client that goes away mid-call (its own timeout)
interrupts the cell: the kernel and its variables stay.  Per-call ``env_vars`` are set
in the call's kernel before the code and restored after it, in its language (both
steps are recorded cells; see :mod:`.call_env`).

Contexts are the sandbox's own (:meth:`AsyncSandbox.create_context
<kernel_sandbox.sandbox.AsyncSandbox.create_context>`): each its own kernel in the same
sandbox, sharing its files, in any language the image has a kernel for (python, r,
javascript/typescript, bash); the notebook records each cell's language.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ...contexts import Context, kernel_for, normalise_language
from ...errors import ConfigError, ContextNotFoundError, KernelError, SandboxError
from ...results import Execution, strip_ansi
from ...sandbox import AsyncSandbox
from ..deps import Opts
from ..tenancy import Lease
from . import call_env
from .control import registry
from .files import _error
from .models import ContextView, CreateContextRequest, ExecuteRequest, e2b_error, iso
from .state import JUPYTER_PORT, E2bSandbox

__all__ = ["e2b_output", "router"]

router = APIRouter(prefix="/e2b/sandbox", tags=["e2b"])

#: E2B's result fields by MIME type (the rest go under ``extra``).
_MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
    # as programs/e2b_display.py names them (JSON media types, as notebooks need)
    "application/vnd.e2b.data+json": "data",
    "application/vnd.e2b.chart+json": "chart",
}


def _view(context: Context) -> dict[str, Any]:
    return ContextView(id=context.id, language=context.language, cwd=context.cwd).model_dump()


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode() + b"\n"


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def e2b_output(output: dict[str, Any]) -> dict[str, Any] | None:
    """One nbformat output as E2B's NDJSON object (None: nothing E2B shows)."""
    kind = output.get("output_type")
    now = iso(time.time())
    if kind == "stream":
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return {"type": name, "text": _text(output.get("text", "")), "timestamp": now}
    if kind in ("execute_result", "display_data"):
        result: dict[str, Any] = {"type": "result", "is_main_result": kind == "execute_result"}
        extra = {}
        for mime, value in dict(output.get("data", {})).items():
            field = _MIME.get(mime)
            if field is None:
                extra[mime] = value
                continue
            text = value if field in ("json", "data", "chart") else _text(value)
            if field == "text" and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
                text = text[1:-1]  # as E2B's server shows a str value
            result[field] = text
        if extra:
            result["extra"] = extra
        return result
    if kind == "error":
        traceback = "\n".join(strip_ansi(t) for t in output.get("traceback", []))
        return {
            "type": "error",
            "name": output.get("ename", ""),
            "value": output.get("evalue", ""),
            "traceback": traceback,
        }
    return None


async def _run(
    request: Request, record: E2bSandbox, lease: Lease, body: ExecuteRequest, timeout: float
) -> AsyncIterator[bytes]:
    """The call's NDJSON lines as the kernel sends outputs; bounded like the result."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    budget = lease.sandbox.config.max_output_bytes
    sandbox = lease.sandbox
    shown = lease.watch_outputs(body.code)

    def on_output(output: dict[str, Any]) -> None:
        nonlocal budget
        shown(output)
        found = e2b_output(output)
        if found is None or found["type"] == "error":
            return  # the error comes once, from the result
        line = _line(found)
        if len(line) <= budget:
            budget -= len(line)
            queue.put_nowait(line)

    async def call() -> Execution:
        try:
            async with registry(request).tenancy.use(record.owner, lease.id, serial=True):
                envs = body.env_vars or {}
                language = _language(sandbox, body)

                async def run(code: str, timeout: float, shown: Any = None) -> Execution:
                    return await sandbox.run_code(
                        code, body.language, context=body.context_id, timeout=timeout,
                        on_output=shown,
                    )  # fmt: skip

                if envs:
                    await run(call_env.set_code(language, envs), 30)
                try:
                    return await run(body.code, timeout, on_output)
                finally:
                    if envs:
                        await run(call_env.restore_code(language, envs), 30)
        finally:
            lease.done_running()
            queue.put_nowait(None)

    task = asyncio.ensure_future(call())
    finished = False
    try:
        while (item := await queue.get()) is not None:
            yield item
        done = await task
        finished = True
    finally:
        if not finished and not task.done():  # the client left: stop the cell, keep state
            with contextlib.suppress(KernelError, SandboxError):
                await sandbox.interrupt()
    if done.error is not None:
        error = {"output_type": "error", "ename": done.error.ename, "evalue": done.error.evalue}
        yield _line({**(e2b_output({**error, "traceback": done.error.traceback}) or {})})
    elif done.status in ("timeout", "kernel_died"):
        name = "TimeoutError" if done.status == "timeout" else "DeadKernelError"
        yield _line({"type": "error", "name": name, "value": done.message, "traceback": ""})
    if done.execution_count is not None:
        yield _line({"type": "number_of_executions", "execution_count": done.execution_count})


def _language(sandbox: AsyncSandbox, body: ExecuteRequest) -> str:
    """The language of the kernel the call runs in."""
    if body.context_id:
        return sandbox.get_context(body.context_id).language
    return normalise_language(body.language or sandbox.default_context.language)


def _refused(exc: SandboxError) -> Response:
    if isinstance(exc, ContextNotFoundError):
        return e2b_error(404, str(exc))
    if isinstance(exc, ConfigError):
        return e2b_error(400, str(exc))
    return _error(exc)


@router.post("/execute", response_model=None)
async def execute(request: Request, body: ExecuteRequest, opts: Opts) -> Response:
    """Run code in a context (the sandbox's own kernel by default), streaming NDJSON."""
    try:
        record, lease = await registry(request).resolve(request.headers, port=JUPYTER_PORT)
        if body.context_id and body.language:
            return e2b_error(400, "Only one of context_id or language can be provided")
        if body.context_id:
            lease.sandbox.get_context(body.context_id)  # a 404 before the stream starts
        language = _language(lease.sandbox, body)
        if body.language:  # the image has a kernel for it: else a 400, not a cut stream
            kernel_for(language, await lease.sandbox.kernelspecs())
        if body.env_vars:
            if not call_env.supported(language):
                raise ConfigError(f"env_vars cannot be set in a {language} kernel")
            call_env.set_code(language, body.env_vars)  # a bad name is refused here
    except SandboxError as exc:
        return _refused(exc)
    return StreamingResponse(
        _run(request, record, lease, body, opts.max_timeout), media_type="application/x-ndjson"
    )


async def _resolved(request: Request) -> tuple[E2bSandbox, Lease]:
    return await registry(request).resolve(request.headers, port=JUPYTER_PORT, token_required=False)


@router.post("/contexts", response_model=None)
async def create_context(request: Request, body: CreateContextRequest) -> Response:
    """A new context: a kernel of its own in the sandbox (its language, its cwd)."""
    try:
        record, lease = await _resolved(request)
        async with registry(request).tenancy.use(record.owner, lease.id):
            await _default_contexts(record, lease.sandbox)  # E2B's come first
            made = await lease.sandbox.create_context(body.language or "python", cwd=body.cwd)
    except SandboxError as exc:
        return _refused(exc)
    return JSONResponse(_view(made))


@router.get("/contexts", response_model=None)
async def list_contexts(request: Request) -> Response:
    """The sandbox's contexts, its own kernel first; as E2B's, a javascript one among
    them where the image has a kernel for it (made at the first listing)."""
    try:
        record, lease = await _resolved(request)
        if not record.default_contexts:
            async with registry(request).tenancy.use(record.owner, lease.id):
                await _default_contexts(record, lease.sandbox)
    except SandboxError as exc:
        return _refused(exc)
    return JSONResponse([_view(c) for c in lease.sandbox.list_contexts()])


async def _default_contexts(record: E2bSandbox, sandbox: AsyncSandbox) -> None:
    """E2B's code interpreter starts a python and a javascript context with a sandbox;
    here the javascript one (where the image has it) comes at the first contexts call."""
    if record.default_contexts:
        return
    made = {c.language for c in sandbox.list_contexts()}
    speaks = set(await sandbox.languages())
    if "javascript" not in made and speaks & {"javascript", "typescript"}:
        await sandbox.create_context("javascript")
    record.default_contexts = True


@router.post("/contexts/{context_id}/restart", response_model=None)
async def restart_context(request: Request, context_id: str) -> Response:
    """A fresh kernel for the context: its variables go, the files stay."""
    try:
        record, lease = await _resolved(request)
        async with registry(request).tenancy.use(record.owner, lease.id):
            await lease.sandbox.restart_context(context_id)
    except SandboxError as exc:
        return _refused(exc)
    return Response(status_code=204)


@router.delete("/contexts/{context_id}", response_model=None)
async def remove_context(request: Request, context_id: str) -> Response:
    """End a context's kernel (the sandbox's own kernel stays with the sandbox)."""
    try:
        record, lease = await _resolved(request)
        async with registry(request).tenancy.use(record.owner, lease.id):
            await lease.sandbox.remove_context(context_id)
    except SandboxError as exc:
        return _refused(exc)
    return Response(status_code=204)
