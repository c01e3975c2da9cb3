"""The manager's values, as ms-enclave names them: kinds, statuses, configurations, info.

They cross the wire (the HTTP manager and the server's enclave API send and parse them)
and :class:`~kernel_sandbox.manager.SandboxManager` keeps them; :mod:`.manager`
re-exports every name, so ``from kernel_sandbox.manager import SandboxInfo`` stays the
way to reach them.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import SandboxConfig
from .errors import ConfigError
from .tools.base import make_tools

__all__ = [
    "DockerSandboxConfig",
    "SandboxInfo",
    "SandboxManagerConfig",
    "SandboxManagerType",
    "SandboxStatus",
    "SandboxType",
    "as_sandbox_config",
]


class SandboxType(StrEnum):
    """Kinds of sandbox a manager can create."""

    DOCKER = "docker"


class SandboxStatus(StrEnum):
    """Where a sandbox is in its life."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"


class SandboxManagerType(StrEnum):
    """Kinds of manager: in-process (local engine) or a ``kernel-sandbox serve`` host."""

    LOCAL = "local"
    HTTP = "http"


class DockerSandboxConfig(SandboxConfig):
    """A sandbox configuration plus the tools the model may use in it.

    ``tools_config`` maps tool names to options, e.g. ``{"python_executor": {"timeout":
    60}}``; only the named tools are enabled.  ``volumes`` also accepts ms-enclave's short
    form ``{host_path: "/container/path"}`` (or ``"/container/path:ro"``).
    """

    tools_config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    privileged: bool = Field(default=False, description="Accepted for compatibility; never True.")

    @field_validator("volumes", mode="before")
    @classmethod
    def _short_volumes(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for host, spec in value.items():
            if isinstance(spec, str):
                bind, _, mode = spec.partition(":")
                spec = {"bind": bind, "mode": mode or "rw"}
            out[host] = spec
        return out

    @field_validator("tools_config", mode="before")
    @classmethod
    def _null_options(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {name: ({} if opts is None else opts) for name, opts in value.items()}
        return value

    @field_validator("tools_config")
    @classmethod
    def _known_tools(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        try:
            make_tools(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("privileged")
    @classmethod
    def _never_privileged(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "privileged containers are not supported: a sandbox must not own its host; "
                "use network (e.g. 'packages') or volumes for what the code needs"
            )
        return value


class SandboxManagerConfig(BaseModel):
    """Settings of a manager."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    labels: dict[str, str] = Field(
        default_factory=dict, description="Labels added to every sandbox this manager creates."
    )
    max_sandboxes: int | None = Field(
        default=None, ge=1, description="Refuse to create more live sandboxes than this."
    )
    pool_size: int = Field(
        default=0,
        ge=0,
        description="Warm sandboxes kept ready (a SandboxPool): create_sandbox hands one "
        "out in milliseconds when its config matches pool_config.",
    )
    pool_config: DockerSandboxConfig | None = Field(
        default=None, description="The sandboxes the pool keeps (default: DockerSandboxConfig())."
    )


class SandboxInfo(BaseModel):
    """What the manager knows about one sandbox."""

    id: str
    status: SandboxStatus
    type: SandboxType
    image: str
    container_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)
    available_tools: dict[str, Any] = Field(default_factory=dict)


def as_sandbox_config(config: SandboxConfig | dict[str, Any] | None) -> DockerSandboxConfig:
    """``config`` as a :class:`DockerSandboxConfig`; a bad one raises ``ConfigError``."""
    if config is None:
        return DockerSandboxConfig()
    if isinstance(config, DockerSandboxConfig):
        return config
    data = config.model_dump() if isinstance(config, SandboxConfig) else dict(config)
    try:
        return DockerSandboxConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid sandbox configuration: {exc}") from exc
