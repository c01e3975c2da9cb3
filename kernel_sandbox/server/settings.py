"""ServerSettings: everything an operator decides for ``kernel-sandbox serve``.

Clients ask; the server decides.  A client's sandbox configuration is mapped onto these
settings (see :mod:`.policy`): the network stays closed unless ``allow_network``, limits
are clamped to the maxima here, host directories are never mounted for a client.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .. import limits
from ..config import DEFAULT_IMAGE, SandboxConfig
from ..errors import ConfigError
from ..limits import MAX_SNAPSHOT_BYTES, MIN_DISK_BYTES, MIN_MEMORY_BYTES, parse_size
from ..snapshots.store import SNAPSHOTS_ENV

__all__ = ["MiB", "ServerSettings", "is_loopback"]

MiB = 1024 * 1024


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerSettings(BaseModel):
    """Settings of one server process; every cap has a bounded default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_keys: tuple[str, ...] = Field(
        default=(), description="Accepted keys; each key is one tenant. Empty: no auth."
    )
    name: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9_.-]{1,40}$",
        description="Label value that marks this server's sandboxes, found again on restart.",
    )
    allow_network: bool = Field(
        default=False, description="Alias: True makes max_network 'full' (when it is unset)."
    )
    max_network: str | list[str] = Field(
        default="none",
        description="The most network a key's sandboxes get: 'none', 'packages' (the host "
        "pip's index through the egress proxy), a list of host patterns, or 'full'.",
    )
    key_networks: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="Per key id (see auth.key_id): its own maximum instead of max_network.",
    )
    default_image: str = DEFAULT_IMAGE
    allowed_images: tuple[str, ...] = Field(
        default=("*",),
        description="Patterns of whole image references clients may ask for (see "
        "images.reference.matches: registry, each path part and the tag matched apart).",
    )
    pull: Literal["never", "allowed"] = Field(
        default="never",
        description="'never': an image the engine does not have is refused with an error; "
        "'allowed': it is pulled from its registry (its size and time are the registry's).",
    )
    derive: bool = Field(
        default=False,
        description="Derive kernel-ready images from plain Python images a client names "
        "(the probe and the venv run under sandbox limits); off: such images start as "
        "they are, their kernel expected at /opt/venv/bin/python.",
    )
    max_sandboxes: int = Field(default=64, ge=1, description="Live sandboxes on this server.")
    max_sandboxes_per_key: int = Field(default=16, ge=1)
    max_request_bytes: int = Field(
        default=limits.MAX_REQUEST_BYTES,
        ge=1024,
        description="Largest request body (413 above), uploads aside.",
    )
    max_upload_bytes: int = Field(
        default=100 * MiB,
        ge=1024,
        description="Largest file upload, download or archive (streamed; an upload past it: 413).",
    )
    allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="Host names (fnmatch patterns) requests may name in their Host header "
        "(421 otherwise); empty: the loopback names on a loopback bind, else any.",
    )
    max_calls_per_key: int = Field(
        default=limits.MAX_CALLS_PER_KEY, ge=1, description="Requests one key has in flight."
    )
    max_streams_per_key: int = Field(
        default=limits.MAX_STREAMS_PER_KEY, ge=1, description="Event streams one key holds open."
    )
    max_mcp_sessions_per_key: int = Field(
        default=limits.MAX_MCP_SESSIONS_PER_KEY,
        ge=1,
        description="MCP sessions one key holds open (its longest-idle one ends past it).",
    )
    max_connections: int = Field(
        default=limits.MAX_CONNECTIONS,
        ge=1,
        description="Open client connections (kept under half the open-file limit).",
    )
    header_timeout: float = Field(
        default=limits.HEADER_TIMEOUT,
        gt=0,
        description="Seconds a connection has to send a whole request head.",
    )
    keep_alive_timeout: float = Field(
        default=limits.KEEP_ALIVE_TIMEOUT,
        gt=0,
        description="Seconds an idle keep-alive connection stays open.",
    )
    idle_timeout: float | None = Field(
        default=1800.0, gt=0, description="Seconds unused before a sandbox is removed."
    )
    max_memory: str = Field(default="2g", description="Most memory a sandbox gets (clamped).")
    max_cpu: float = Field(default=2.0, gt=0, allow_inf_nan=False, description="Most CPUs.")
    max_disk: str = Field(default="1g", description="Most disk_limit a sandbox gets (clamped).")
    max_timeout: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="Longest call a client may ask (calls, defaults and tool options).",
    )
    pool_size: int = Field(default=0, ge=0, description="Warm sandboxes of the default config.")
    on_restart: Literal["adopt", "remove", "restore", "keep"] = Field(
        default="adopt",
        description="What to do at start with sandboxes a previous run of this server left "
        "(it was killed): adopt them (each key gets its running sandbox back, the same "
        "kernel, variables kept; those without an owner are removed); remove them; "
        "restore them (same id, same key, a fresh container whose state is rebuilt by "
        "replaying the recorded notebook); or keep them running for `kernel-sandbox ps`/`gc`.",
    )
    record_dir: Path = Field(
        default=Path("notebooks") / "server",
        description="Where every sandbox's session notebook is written (<key id>/<id>.ipynb).",
    )
    snapshot_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get(SNAPSHOTS_ENV) or "snapshots/server"),
        description="Where snapshots and paused sandboxes are kept (a volume, so that they "
        "survive a restart; default $KERNEL_SANDBOX_SNAPSHOTS, else snapshots/server).",
    )
    pause_after: float | None = Field(
        default=None,
        gt=0,
        description="Seconds unused before a sandbox is paused (snapshot, container "
        "removed); the next call resumes it. None: idle sandboxes are not paused.",
    )
    max_snapshot_bytes: int = Field(
        default=MAX_SNAPSHOT_BYTES, gt=0, description="Largest snapshot a key may make."
    )
    max_snapshots_per_key: int = Field(
        default=32, ge=1, description="Snapshots a key may keep (paused sandboxes aside)."
    )
    e2b_templates: dict[str, str] = Field(
        default_factory=dict,
        description="E2B template name -> image, for the E2B API (/e2b); 'base' and "
        "'code-interpreter-v1' are the default image unless named here.",
    )
    record_flush_delay: float = Field(
        default=0.25,
        ge=0,
        le=60,
        description="Seconds a recorded step may wait before its notebook is rewritten "
        "(steps in between coalesce into one write; 0 writes on every step, on the "
        "request path). A killed server loses at most this much of each notebook.",
    )

    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes behind the one port (`serve --workers N`); any "
        "serves any sandbox, sharing record_dir (see kernel_sandbox.server.replicas).",
    )

    replica: bool = Field(
        default=False,
        description="One of several replicas of this server (`serve --replica`: the pods "
        "of a Deployment), sharing its name, record_dir and snapshot_dir on a shared "
        "volume: any replica serves any sandbox, none removes sandboxes when it starts "
        "or stops, and one at a time (a Kubernetes Lease on the kubernetes host, else a "
        "lock file in record_dir) reaps idle sandboxes and removes orphans (see "
        "kernel_sandbox.server.replicas).",
    )

    keep_notebook_turns: bool | None = Field(
        default=None,
        description="Whether a recorded call keeps its notebook's writing turn for the "
        "calls after it in this process (written behind, coalesced; handed over when "
        "another writer pokes the notebook's turn FIFO, a pipe of one host's kernel). "
        "None: workers do (one host), replicas do not (their volume may be shared across "
        "nodes, where a poke is not heard). True for replicas whose shared volume is one "
        "node's (a hostPath or local PersistentVolume: deploy/kubernetes-local).",
    )

    @model_validator(mode="after")
    def _check_workers(self) -> ServerSettings:
        if self.workers > 1 or self.replica:
            for name, unsupported in (
                ("pool_size", self.pool_size),
                ("pause_after", self.pause_after),
                ("on_restart='restore'", self.on_restart == "restore"),
            ):
                if unsupported:
                    raise ValueError(
                        f"{name} is not supported with several workers or replicas "
                        "yet; run one worker, or leave it unset"
                    )
        return self

    @model_validator(mode="before")
    @classmethod
    def _allow_network_alias(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("allow_network") and "max_network" not in data:
            return {**data, "max_network": "full"}
        return data

    @field_validator("max_memory", "max_disk")
    @classmethod
    def _check_size(cls, value: str, info: ValidationInfo) -> str:
        least = MIN_DISK_BYTES if info.field_name == "max_disk" else MIN_MEMORY_BYTES
        parse_size(value, str(info.field_name), least)
        return value.strip().lower()

    @field_validator("max_network", "key_networks")
    @classmethod
    def _check_networks(cls, value: object) -> object:
        for network in value.values() if isinstance(value, dict) else [value]:
            try:
                SandboxConfig(network=network)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("invalid SandboxConfig: ")) from None
        return value

    def network_ceiling(self, key: str) -> str | list[str]:
        """The most network the sandboxes of key id ``key`` may have."""
        return self.key_networks.get(key, self.max_network)

    def check_bind(self) -> None:
        """Refuse to listen beyond this machine without a key: anyone could run code."""
        if not self.api_keys and not is_loopback(self.host):
            raise ConfigError(
                f"refusing to listen on {self.host} without an API key: anyone who reaches "
                "it could run code; pass --api-key/--api-key-file or bind 127.0.0.1"
            )
