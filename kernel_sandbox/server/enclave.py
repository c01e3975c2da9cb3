"""ms-enclave's REST API, wire-compatible with ``ms-enclave[docker]==0.0.8``'s client.

Its ``HttpSandboxManager`` runs against this server unmodified: the same paths, query
parameters, bodies, status codes (only 200 is success) and models (``SandboxInfo``,
``ToolResult``).  Both ``docker`` and ``docker_notebook`` sandboxes are accepted (the
latter's ``notebook_executor`` is our ``python_executor``: state kept across calls),
``tools_config`` as a list or a dict, and file_operation's ``create`` (= ``write``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from .. import __version__
from ..errors import ConfigError
from ..manager import SandboxInfo, SandboxStatus
from ..tools.results import ToolResult
from .archives import unpack_archive
from .deps import Key, Opts, Ten, json_response
from .policy import TOOL_ALIASES, client_config
from .tenancy import Tenancy

__all__ = ["router"]

router = APIRouter(tags=["ms-enclave"])
_KINDS = ("docker", "docker_notebook")
_STARTED = time.time()


class ToolExecutionRequest(BaseModel):
    """ms-enclave's request body of ``POST /sandbox/tool/execute``."""

    sandbox_id: str
    tool_name: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    timeout: int | None = None


class Health(BaseModel):
    """ms-enclave's ``HealthCheckResult``."""

    healthy: bool
    version: str
    uptime: float
    active_sandboxes: int
    system_info: dict[str, Any] = Field(default_factory=dict)


def _kind(sandbox_type: str) -> str:
    if sandbox_type not in _KINDS:
        raise ConfigError(f"unknown sandbox_type {sandbox_type!r}; use one of: {', '.join(_KINDS)}")
    return sandbox_type


def _rename_tools(tools: dict[str, Any], kind: str) -> dict[str, Any]:
    """docker_notebook sandboxes name their executor ``notebook_executor``, as ms-enclave."""
    if kind != "docker_notebook" or "python_executor" not in tools:
        return tools
    out = dict(tools)
    schema = dict(out.pop("python_executor"))
    if isinstance(schema.get("function"), dict):
        schema["function"] = {**schema["function"], "name": "notebook_executor"}
    out["notebook_executor"] = schema
    return out


async def _info(ten: Tenancy, key: str, sandbox_id: str) -> dict[str, Any]:
    lease = await ten.live(key, sandbox_id)
    info: SandboxInfo = await ten.manager.get_sandbox_info(sandbox_id)
    data = info.model_dump(mode="json")
    data["type"] = lease.kind
    data["metadata"] = {**data["metadata"], "owner": key, "notebook": lease.notebook_path.name}
    if lease.notes:
        data["metadata"]["policy"] = lease.notes
    data["available_tools"] = _rename_tools(data["available_tools"], lease.kind)
    return data


@router.get("/health", response_model=Health)
async def health(ten: Ten, key: Key) -> Health:
    """Liveness, version, uptime and the caller's sandbox count."""
    mine = ten.owned(key)
    return Health(
        healthy=True,
        version=__version__,
        uptime=time.time() - _STARTED,
        active_sandboxes=len(mine),
        system_info={"server": ten.settings.name, "total_sandboxes": len(mine)},
    )


@router.get("/stats")
async def stats(ten: Ten, key: Key) -> dict[str, Any]:
    """Counts of the caller's sandboxes by status and type."""
    infos = [await _info(ten, key, lease.id) for lease in ten.owned(key)]
    counts: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for info in infos:
        counts[info["status"]] = counts.get(info["status"], 0) + 1
        kinds[info["type"]] = kinds.get(info["type"], 0) + 1
    return {
        "manager_type": "http-server",
        "total_sandboxes": len(infos),
        "status_counts": counts,
        "sandbox_types": kinds,
        "running": True,
    }


@router.post("/sandbox/create")
async def create_sandbox(
    ten: Ten,
    opts: Opts,
    key: Key,
    sandbox_type: str = Query(...),
    config: Annotated[dict[str, Any] | None, Body()] = None,
) -> dict[str, str]:
    """Start a sandbox from a client's config, under the server's policy."""
    kind = _kind(sandbox_type)
    cfg, notes = client_config(config, opts, key)
    lease = await ten.create(key, cfg, kind, notes)
    return {"sandbox_id": lease.id}


@router.get("/sandboxes")
async def list_sandboxes(
    ten: Ten,
    key: Key,
    status: SandboxStatus | None = None,
) -> list[dict[str, Any]]:
    """The caller's sandboxes, optionally only those in one status."""
    infos = [await _info(ten, key, lease.id) for lease in await ten.everyone(key)]
    return [i for i in infos if status is None or i["status"] == status.value]


@router.get("/sandbox/{sandbox_id}")
async def get_sandbox(sandbox_id: str, ten: Ten, key: Key) -> dict[str, Any]:
    """One sandbox of the caller (ms-enclave's ``SandboxInfo``)."""
    return await _info(ten, key, sandbox_id)


@router.post("/sandbox/{sandbox_id}/stop")
async def stop_sandbox(sandbox_id: str, ten: Ten, key: Key) -> dict[str, str]:
    """Remove the container, keep the record (status ``stopped``)."""
    await ten.stop_one(key, sandbox_id)
    return {"message": "Sandbox stopped successfully"}


@router.delete("/sandbox/{sandbox_id}")
async def delete_sandbox(sandbox_id: str, ten: Ten, key: Key) -> dict[str, str]:
    """Remove the sandbox; its notebook stays on the server."""
    await ten.delete(key, sandbox_id)
    return {"message": "Sandbox deleted successfully"}


@router.get("/sandbox/{sandbox_id}/tools")
async def get_tools(sandbox_id: str, ten: Ten, key: Key) -> dict[str, Any]:
    """``{name: OpenAI function schema}`` of the sandbox's tools."""
    lease = await ten.live(key, sandbox_id)
    return _rename_tools(await ten.manager.get_sandbox_tools(sandbox_id), lease.kind)


def _translate(tool_name: str, parameters: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """ms-enclave's names onto ours: notebook_executor, file_operation's ``create``."""
    name = TOOL_ALIASES.get(tool_name, tool_name)
    if name == "file_operation" and parameters.get("operation") == "create":
        parameters = {**parameters, "operation": "write"}
    return name, parameters


def _as_enclave(result: ToolResult, asked: str) -> dict[str, Any]:
    data = result.model_dump(mode="json")
    data["tool_name"] = asked
    return data


@router.post("/sandbox/tool/execute", response_model=None)
async def execute_tool(request: ToolExecutionRequest, ten: Ten, key: Key) -> Response:
    """Run one tool call; failures of the call are ``status="error"`` results (200)."""
    name, params = _translate(request.tool_name, request.parameters)
    if request.timeout is not None and "timeout" not in params and name != "file_operation":
        params = {**params, "timeout": request.timeout}
    async with ten.use(key, request.sandbox_id, serial=True):
        result = await ten.manager.execute_tool(request.sandbox_id, name, params)
    return json_response(_as_enclave(result, request.tool_name))


@router.post("/sandbox/{sandbox_id}/archive")
async def put_archive(
    sandbox_id: str,
    request: Request,
    ten: Ten,
    opts: Opts,
    key: Key,
    target_dir: str = Query(...),
) -> dict[str, bool]:
    """Unpack a tar archive (the body) into a sandbox directory, as the sandbox user.

    Only directories and regular files are taken; links, devices and members that
    point outside ``target_dir`` are refused (400).  The body is capped (413), and so
    is what it unpacks to, members counted (see :mod:`.archives`).
    """
    data = await request.body()
    if not data:
        raise HTTPException(status_code=400, detail="Archive body must not be empty")
    async with ten.use(key, sandbox_id) as lease:
        target = lease.sandbox.resolve_path(target_dir)
        await unpack_archive(data, lease.sandbox, target, opts.max_upload_bytes)
    return {"ok": True}


@router.post("/pool/initialize")
async def initialize_pool(
    ten: Ten,
    opts: Opts,
    key: Key,
    pool_size: int | None = Query(None, ge=1, le=64),
    sandbox_type: str | None = None,
    config: Annotated[dict[str, Any] | None, Body()] = None,
) -> dict[str, Any]:
    """Start the caller's pool: ``pool_size`` sandboxes used by ``/pool/execute``."""
    kind = _kind(sandbox_type or "docker")
    cfg, notes = client_config(config, opts, key)
    ids = await ten.init_pool(key, pool_size or 1, cfg, kind, notes)
    return {"message": "Pool initialized successfully", "pool_size": len(ids), "sandbox_ids": ids}


@router.post("/pool/execute", response_model=None)
async def execute_in_pool(
    parameters: Annotated[dict[str, Any], Body()],
    ten: Ten,
    key: Key,
    tool_name: str = Query(...),
    timeout: float | None = Query(None, gt=0, le=3600),
) -> dict[str, Any]:
    """Run one tool call on a free sandbox of the caller's pool (408 if none frees up)."""
    name, params = _translate(tool_name, parameters)
    try:
        async with ten.pooled(key, timeout or 30.0) as lease:
            result = await ten.manager.execute_tool(lease.id, name, params)
    except TimeoutError:
        raise HTTPException(408, "no sandbox of the pool became free in time") from None
    return _as_enclave(result, tool_name)
