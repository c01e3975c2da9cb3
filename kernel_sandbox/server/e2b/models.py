"""The JSON of E2B's control API and code interpreter, as their SDKs read and write it.

Field names are E2B's own (``templateID``, ``envdAccessToken``, ...): the models take
them by alias and give them back by alias.  Requests accept fields we do not use
(E2B's API grows; an unknown field is no reason to refuse a sandbox), responses carry
every field the SDK's generated client requires.  Errors have E2B's shape,
``{"code": <status>, "message": "..."}``.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ENVD_VERSION",
    "ConnectRequest",
    "ContextView",
    "CreateContextRequest",
    "ExecuteRequest",
    "ListedSandbox",
    "NewSandbox",
    "SandboxCreated",
    "SandboxDetail",
    "SandboxMetric",
    "TimeoutRequest",
    "e2b_error",
    "iso",
]

#: The envd version this server speaks for: default user, stdin, CloseStdin, octet-stream
#: uploads, recursive watch, file metadata (``user.e2b.*`` xattrs, 0.6.2), entries in
#: watch events (0.6.3), watching with ``allow_network_mounts`` (0.6.4).
ENVD_VERSION = "0.6.4"


def e2b_error(status: int, message: str) -> JSONResponse:
    """An error as E2B's API answers one."""
    return JSONResponse({"code": status, "message": message}, status_code=status)


def iso(timestamp: float) -> str:
    """A Unix time as the RFC 3339 text E2B's API sends."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat()


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class NewSandbox(_In):
    """``POST /sandboxes`` and ``/v2/sandboxes``."""

    template_id: str = Field(alias="templateID", max_length=200)
    timeout: int = Field(default=15, ge=0)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=100)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars", max_length=1000)
    auto_pause: bool = Field(default=False, alias="autoPause")
    allow_internet_access: bool | None = None
    secure: bool | None = None
    volume_mounts: list[dict[str, Any]] | None = Field(default=None, alias="volumeMounts")
    mcp: dict[str, Any] | None = None


class ConnectRequest(_In):
    """``POST /sandboxes/{id}/connect`` (and ``/v2``)."""

    timeout: int | None = Field(default=None, ge=0)


class TimeoutRequest(_In):
    """``POST /sandboxes/{id}/timeout``."""

    timeout: int = Field(ge=0)


class SandboxCreated(_Out):
    """What create and connect answer."""

    template_id: str = Field(serialization_alias="templateID")
    sandbox_id: str = Field(serialization_alias="sandboxID")
    client_id: str = Field(serialization_alias="clientID")
    envd_version: str = Field(default=ENVD_VERSION, serialization_alias="envdVersion")
    envd_access_token: str = Field(serialization_alias="envdAccessToken")
    alias: str | None = None
    domain: str | None = None


class ListedSandbox(_Out):
    """One sandbox of a listing."""

    template_id: str = Field(serialization_alias="templateID")
    sandbox_id: str = Field(serialization_alias="sandboxID")
    client_id: str = Field(serialization_alias="clientID")
    alias: str | None = None
    started_at: str = Field(serialization_alias="startedAt")
    end_at: str = Field(serialization_alias="endAt")
    cpu_count: int = Field(serialization_alias="cpuCount")
    memory_mb: int = Field(serialization_alias="memoryMB")
    disk_size_mb: int = Field(serialization_alias="diskSizeMB")
    state: Literal["running", "paused"] = "running"
    envd_version: str = Field(default=ENVD_VERSION, serialization_alias="envdVersion")
    metadata: dict[str, str] = Field(default_factory=dict)


class SandboxDetail(ListedSandbox):
    """``GET /sandboxes/{id}``."""

    envd_access_token: str = Field(serialization_alias="envdAccessToken")
    domain: str | None = None


class SandboxMetric(_Out):
    """One sample of ``GET /sandboxes/{id}/metrics``."""

    timestamp: str
    timestamp_unix: int = Field(serialization_alias="timestampUnix")
    cpu_count: int = Field(serialization_alias="cpuCount")
    cpu_used_pct: float = Field(serialization_alias="cpuUsedPct")
    mem_used: int = Field(serialization_alias="memUsed")
    mem_total: int = Field(serialization_alias="memTotal")
    mem_cache: int = Field(default=0, serialization_alias="memCache")
    disk_used: int = Field(serialization_alias="diskUsed")
    disk_total: int = Field(serialization_alias="diskTotal")


# -- the code interpreter (port 49999) --------------------------------------------------


class ExecuteRequest(_In):
    """``POST /execute``."""

    code: str = Field(max_length=1_000_000)
    context_id: str | None = None
    language: str | None = Field(default=None, max_length=40)
    env_vars: dict[str, str] | None = None


class CreateContextRequest(_In):
    """``POST /contexts``."""

    language: str | None = Field(default=None, max_length=40)
    cwd: str | None = Field(default=None, max_length=4096)


class ContextView(_Out):
    """A context as ``/contexts`` shows it."""

    id: str
    language: str
    cwd: str
