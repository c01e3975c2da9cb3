"""The code interpreter's routes (E2B port 49999): ``POST /execute`` and ``/contexts``.

``/execute`` runs code in the sandbox's persistent kernel (``run_python``, so every
call is recorded in the session's notebook like any other) and streams NDJSON lines
as the kernel sends outputs: ``stdout``/``stderr`` text, ``result`` objects (text,
html, markdown, svg, png, jpeg, pdf, latex, json, javascript; ``is_main_result`` for
the last expression's value, other MIME types under ``extra``), an ``error`` (name,
value, traceback), then ``number_of_executions``.  Streamed outputs are capped by the
sandbox's ``max_output_bytes``.  A client that goes away mid-call (its own timeout)
interrupts the cell: the kernel and its variables stay.  Per-call ``env_vars`` are set
in the kernel before the code and restored after it (both steps are recorded cells).

Contexts: this server's sandboxes have one kernel each until the multi-kernel work
lands, so ``/contexts`` lists that one default Python context; creating another, or
another language, answers E2B's error shape (501) saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ...errors import KernelError, SandboxError
from ...results import Execution, strip_ansi
from ..deps import Opts
from ..tenancy import Lease
from .control import registry
from .files import _error
from .models import ContextView, CreateContextRequest, ExecuteRequest, e2b_error, iso
from .state import JUPYTER_PORT, E2bSandbox

__all__ = ["Context", "router"]

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
}
_NO_CONTEXTS = (
    "this server runs one kernel per sandbox until multi-kernel contexts land: only the "
    "default python context exists"
)


@dataclass(frozen=True)
class Context:
    """A code-interpreter context: a kernel of the sandbox, its language and cwd."""

    id: str
    language: str
    cwd: str

    def view(self) -> dict[str, Any]:
        """The context as ``/contexts`` shows it."""
        return ContextView(id=self.id, language=self.language, cwd=self.cwd).model_dump()


def _default(record: E2bSandbox, lease: Lease) -> Context:
    if "default" not in record.contexts:
        record.contexts["default"] = Context(str(uuid.uuid4()), "python", lease.sandbox.working_dir)
    return record.contexts["default"]


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode() + b"\n"


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def e2b_outputs(output: dict[str, Any]) -> dict[str, Any] | None:
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


def _env_code(values: dict[str, str]) -> str:
    return f"import os as _os\n_os.environ.update({values!r})\ndel _os"


def _probe_code(values: dict[str, str]) -> str:
    names = list(values)
    return (
        "import os as _os, json as _j\n"
        f"print(_j.dumps({{_k: _os.environ.get(_k) for _k in {names}}}))\n"
        "del _os, _j"
    )


def _restore_code(before: dict[str, str | None]) -> str:
    return (
        "import os as _os\n"
        f"for _k, _v in {before!r}.items():\n"
        "    _os.environ.pop(_k, None) if _v is None else _os.environ.__setitem__(_k, _v)\n"
        "del _os, _k, _v"
    )


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
        found = e2b_outputs(output)
        if found is None or found["type"] == "error":
            return  # the error comes once, from the result
        line = _line(found)
        if len(line) <= budget:
            budget -= len(line)
            queue.put_nowait(line)

    async def call() -> Execution:
        try:
            async with registry(request).tenancy.use(record.owner, lease.id):
                envs = body.env_vars or {}
                if envs:
                    before = json.loads(
                        (await sandbox.run_python(_probe_code(envs), 30)).stdout or "{}"
                    )
                    await sandbox.run_python(_env_code(envs), 30)
                try:
                    return await sandbox.run_python(body.code, timeout, on_output=on_output)
                finally:
                    if envs:
                        await sandbox.run_python(_restore_code(before), 30)
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
        yield _line({**(e2b_outputs({**error, "traceback": done.error.traceback}) or {})})
    elif done.status in ("timeout", "kernel_died"):
        name = "TimeoutError" if done.status == "timeout" else "DeadKernelError"
        yield _line({"type": "error", "name": name, "value": done.message, "traceback": ""})
    if done.execution_count is not None:
        yield _line({"type": "number_of_executions", "execution_count": done.execution_count})


@router.post("/execute", response_model=None)
async def execute(request: Request, body: ExecuteRequest, opts: Opts) -> Response:
    """Run code in a context (the default Python one by default), streaming NDJSON."""
    try:
        record, lease = registry(request).resolve(request.headers, port=JUPYTER_PORT)
    except SandboxError as exc:
        return _error(exc)
    if body.context_id and body.language:
        return e2b_error(400, "Only one of context_id or language can be provided")
    default = _default(record, lease)
    if body.context_id and body.context_id != default.id:
        return e2b_error(404, f"Context {body.context_id} not found")
    if body.language and body.language.lower() not in ("python", "py"):
        return e2b_error(501, f"language {body.language!r}: {_NO_CONTEXTS}")
    return StreamingResponse(
        _run(request, record, lease, body, opts.max_timeout), media_type="application/x-ndjson"
    )


def _resolved(request: Request) -> tuple[E2bSandbox, Lease]:
    return registry(request).resolve(request.headers, port=JUPYTER_PORT, token_required=False)


@router.post("/contexts", response_model=None)
async def create_context(request: Request, body: CreateContextRequest) -> Response:
    """A new context: only the default Python one exists here (see the module doc)."""
    try:
        record, lease = _resolved(request)
    except SandboxError as exc:
        return _error(exc)
    default = _default(record, lease)
    language = (body.language or "python").lower()
    if language == "python" and (body.cwd or default.cwd) == default.cwd:
        return JSONResponse(default.view())
    return e2b_error(501, _NO_CONTEXTS)


@router.get("/contexts", response_model=None)
async def list_contexts(request: Request) -> Response:
    """The sandbox's contexts."""
    try:
        record, lease = _resolved(request)
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse([_default(record, lease).view()])


@router.post("/contexts/{context_id}/restart", response_model=None)
async def restart_context(request: Request, context_id: str) -> Response:
    """A fresh kernel for the context: its variables go, the files stay."""
    try:
        record, lease = _resolved(request)
        if context_id != _default(record, lease).id:
            return e2b_error(404, f"Context {context_id} not found")
        async with registry(request).tenancy.use(record.owner, lease.id):
            await lease.sandbox.restart()
    except SandboxError as exc:
        return _error(exc)
    return Response(status_code=204)


@router.delete("/contexts/{context_id}", response_model=None)
async def remove_context(request: Request, context_id: str) -> Response:
    """Remove a context: the default one stays with its sandbox (see the module doc)."""
    try:
        record, lease = _resolved(request)
    except SandboxError as exc:
        return _error(exc)
    if context_id != _default(record, lease).id:
        return e2b_error(404, f"Context {context_id} not found")
    return e2b_error(501, f"the default context cannot be removed: {_NO_CONTEXTS}")
