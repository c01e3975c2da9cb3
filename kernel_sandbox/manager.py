"""The manager API users know from ms-enclave: sandboxes by id, tools by name.

::

    async with SandboxManagerFactory.create_manager() as manager:
        sandbox_id = await manager.create_sandbox(SandboxType.DOCKER, DockerSandboxConfig(
            tools_config={"python_executor": {}, "shell_executor": {}, "file_operation": {}},
        ))
        tools = await manager.get_sandbox_tools(sandbox_id)        # {name: OpenAI schema}
        result = await manager.execute_tool(sandbox_id, "python_executor", {"code": "1+1"})

A manager owns the sandboxes it created and removes all of them when the ``async with``
block ends.  Tool calls never raise (see :mod:`kernel_sandbox.tools`); only mistakes of
the caller do, such as an unknown sandbox id (``SandboxNotFoundError``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .backends.base import REMOVED_REASON
from .backends.factory import HostFactory
from .config import SandboxConfig
from .errors import ConfigError, SandboxNotFoundError
from .manager_models import (
    DockerSandboxConfig,
    SandboxInfo,
    SandboxManagerConfig,
    SandboxManagerType,
    SandboxStatus,
    SandboxType,
    as_sandbox_config,
)
from .pool import SandboxPool
from .protocols import ManagerLike
from .sandbox import AsyncSandbox
from .tools.base import ToolSet, called_name
from .tools.results import ToolResult
from .tools.schema import SchemaFormat

__all__ = [
    "DockerSandboxConfig",
    "LocalSandboxManager",
    "SandboxInfo",
    "SandboxManager",
    "SandboxManagerConfig",
    "SandboxManagerFactory",
    "SandboxManagerType",
    "SandboxStatus",
    "SandboxType",
    "register_manager",
]

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    id: str
    type: SandboxType
    config: DockerSandboxConfig
    sandbox: AsyncSandbox
    tools: ToolSet
    pooled: bool = False
    status: SandboxStatus = SandboxStatus.RUNNING
    created_at: datetime = field(default_factory=datetime.now)
    updated_at: datetime = field(default_factory=datetime.now)
    #: Why the sandbox is in ERROR (its container stopped, was removed, engine down).
    error: str | None = None

    def set_status(self, status: SandboxStatus, error: str | None = None) -> None:
        if (status, error) != (self.status, self.error):
            self.status, self.error = status, error
            self.updated_at = datetime.now()

    @property
    def gone(self) -> bool:
        """The container was removed from outside: no call can succeed any more."""
        return self.error == REMOVED_REASON


class SandboxManager:
    """Creates sandboxes, hands out their tools, runs tool calls; cleans up on exit."""

    def __init__(
        self,
        config: SandboxManagerConfig | None = None,
        *,
        host: str | HostFactory | None = None,
        **settings: Any,
    ) -> None:
        try:
            self.config = config or SandboxManagerConfig(**settings)
        except ValidationError as exc:
            raise ConfigError(f"invalid manager settings: {exc}") from exc
        self._host = host
        self._entries: dict[str, _Entry] = {}
        self._running = False
        self._pool: SandboxPool | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start the manager and its warm pool, if any (``async with`` does this)."""
        self._running = True
        if self.config.pool_size and self._pool is None:
            pool_cfg = self.config.pool_config or DockerSandboxConfig()
            labels = {**self.config.labels, **pool_cfg.labels}
            pool = SandboxPool(pool_cfg, size=self.config.pool_size, host=self._host, labels=labels)
            await pool.start()
            self._pool = pool

    async def stop(self) -> None:
        """Remove every sandbox this manager created (``async with`` does this)."""
        await self.cleanup_all_sandboxes()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        self._running = False

    def _pool_serves(self, cfg: DockerSandboxConfig) -> bool:
        """Whether a pool member is exactly the sandbox ``cfg`` asks for (tools aside)."""
        if self._pool is None:
            return False
        wanted = (self.config.pool_config or DockerSandboxConfig()).model_dump(
            exclude={"tools_config", "labels"}
        )
        return cfg.model_dump(exclude={"tools_config", "labels"}) == wanted and not cfg.labels

    async def __aenter__(self) -> SandboxManager:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- sandboxes ---------------------------------------------------------------

    async def create_sandbox(
        self,
        sandbox_type: SandboxType | str = SandboxType.DOCKER,
        config: SandboxConfig | dict[str, Any] | None = None,
        sandbox_id: str | None = None,
    ) -> str:
        """Start a sandbox with its tools; returns its id.

        Raises ``ConfigError`` for a bad configuration and the ``SandboxError`` of the
        failure when the container or kernel does not come up.
        """
        try:
            kind = SandboxType(sandbox_type)
        except ValueError:
            known = ", ".join(t.value for t in SandboxType)
            raise ConfigError(
                f"unknown sandbox type {sandbox_type!r}; use one of: {known}"
            ) from None
        cfg = as_sandbox_config(config)
        if sandbox_id is not None and sandbox_id in self._entries:
            raise ConfigError(f"a sandbox with id {sandbox_id!r} exists already; pick another id")
        live = sum(e.status == SandboxStatus.RUNNING for e in self._entries.values())
        if self.config.max_sandboxes is not None and live >= self.config.max_sandboxes:
            raise ConfigError(
                f"this manager already runs {live} sandboxes (max_sandboxes="
                f"{self.config.max_sandboxes}); delete one or raise the limit"
            )
        if not self._running:
            await self.start()
        pooled = self._pool_serves(cfg)
        if pooled:
            assert self._pool is not None
            sandbox = await self._pool.acquire()
        else:
            if self.config.labels:
                cfg = cfg.with_overrides(labels={**self.config.labels, **cfg.labels})  # type: ignore[assignment]
            sandbox = await AsyncSandbox.create(cfg, host=self._host)
        sid = sandbox_id or sandbox.id
        tools = ToolSet(sandbox, cfg.tools_config)
        self._entries[sid] = _Entry(sid, kind, cfg, sandbox, tools, pooled)
        log.info("created sandbox %s (image %s)", sid, sandbox.image)
        return sid

    def add_sandbox(
        self,
        sandbox: AsyncSandbox,
        config: SandboxConfig | dict[str, Any] | None = None,
        sandbox_id: str | None = None,
        *,
        pooled: bool = False,
    ) -> str:
        """Manage a sandbox made elsewhere (e.g. :meth:`AsyncSandbox.adopt` after a
        restart); from now on it is this manager's, as if it had created it."""
        sid = sandbox_id or sandbox.id
        if sid in self._entries:
            raise ConfigError(f"a sandbox with id {sid!r} exists already; pick another id")
        cfg = as_sandbox_config(config)
        tools = ToolSet(sandbox, cfg.tools_config)
        self._entries[sid] = _Entry(sid, SandboxType.DOCKER, cfg, sandbox, tools, pooled)
        return sid

    def _entry(self, sandbox_id: str) -> _Entry:
        # an id that is not a string (a list, say) is unhashable: not found, not a TypeError
        entry = self._entries.get(sandbox_id) if isinstance(sandbox_id, str) else None
        if entry is None:
            known = ", ".join(self._entries) or "none"
            raise SandboxNotFoundError(
                f"no sandbox with id {called_name(sandbox_id)!r} in this manager (known: "
                f"{known}); use the id create_sandbox returned"
            )
        return entry

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """The :class:`AsyncSandbox` behind an id, for direct use."""
        return self._entry(sandbox_id).sandbox

    def get_toolset(self, sandbox_id: str) -> ToolSet:
        """The :class:`ToolSet` of a sandbox."""
        return self._entry(sandbox_id).tools

    async def _refresh(self, entry: _Entry) -> None:
        """Ask the engine whether a live sandbox still runs, so its status is the truth.

        A container killed from outside is ERROR until a call restarts it (then RUNNING
        again); a removed one stays ERROR for good.  STOPPED is the manager's own doing.
        """
        if entry.status == SandboxStatus.STOPPED or entry.gone:
            return
        problem = await entry.sandbox.health()
        entry.set_status(SandboxStatus.ERROR if problem else SandboxStatus.RUNNING, problem)

    async def _info(self, entry: _Entry) -> SandboxInfo:
        await self._refresh(entry)
        metadata: dict[str, Any] = {"owner": "local"}
        if entry.error:
            metadata["error"] = entry.error
        return SandboxInfo(
            id=entry.id,
            status=entry.status,
            type=entry.type,
            image=entry.sandbox.image,
            container_id=entry.sandbox.container_id,
            config=entry.config.model_dump(exclude_none=True),
            created_at=entry.created_at,
            updated_at=entry.updated_at,
            metadata=metadata,
            available_tools=entry.tools.schema_map(),
        )

    async def get_sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        """Status, image, container and tools of one sandbox (the engine is asked)."""
        return await self._info(self._entry(sandbox_id))

    async def list_sandboxes(self, status_filter: SandboxStatus | None = None) -> list[SandboxInfo]:
        """Every sandbox of this manager, optionally only those in one status."""
        infos = [await self._info(e) for e in list(self._entries.values())]
        return [i for i in infos if status_filter is None or i.status == status_filter]

    async def stop_sandbox(self, sandbox_id: str) -> bool:
        """Stop a sandbox: its container is removed, its record stays (status ``stopped``).

        Tool calls on a stopped sandbox return an error result.  Returns True.
        """
        entry = self._entry(sandbox_id)
        if entry.status != SandboxStatus.STOPPED:
            try:
                await self._dispose(entry)
            finally:
                entry.set_status(SandboxStatus.STOPPED)
        return True

    async def _dispose(self, entry: _Entry) -> None:
        # A pool member goes back to its pool, which destroys it and starts a fresh one.
        if entry.pooled and self._pool is not None:
            await self._pool.release(entry.sandbox)
        await entry.sandbox.close()

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Stop a sandbox and forget it.  Returns True."""
        entry = self._entry(sandbox_id)
        try:
            await self._dispose(entry)
        finally:
            self._entries.pop(sandbox_id, None)
        return True

    async def release_sandbox(self, sandbox_id: str) -> None:
        """Forget a sandbox without removing it: it runs on for another process (a
        server worker that stops while others serve the sandbox)."""
        entry = self._entries.pop(sandbox_id, None)
        if entry is not None:
            await entry.sandbox.detach()

    async def cleanup_all_sandboxes(self) -> None:
        """Delete every sandbox of this manager; failures are logged, not raised."""
        ids = list(self._entries)
        results = await asyncio.gather(
            *(self.delete_sandbox(i) for i in ids), return_exceptions=True
        )
        for sid, outcome in zip(ids, results, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("could not remove sandbox %s: %s", sid, outcome)

    # -- tools -------------------------------------------------------------------

    async def get_sandbox_tools(
        self, sandbox_id: str, format: SchemaFormat = "chat", *, strict: bool = True
    ) -> dict[str, Any]:
        """``{name: schema}`` of the enabled tools; ``list(tools.values())`` is ``tools=``.

        ``format="responses"`` gives the Responses API function format instead.
        """
        return self._entry(sandbox_id).tools.schema_map(format, strict=strict)

    async def execute_tool(
        self, sandbox_id: str, tool_name: str, parameters: dict[str, Any] | str | None
    ) -> ToolResult:
        """Run one tool call; ``parameters`` may be a dict or the model's JSON string.

        Every failure of the call is a ``ToolResult`` with ``status="error"``; only an
        unknown ``sandbox_id`` raises (``SandboxNotFoundError``).
        """
        entry = self._entry(sandbox_id)
        if entry.status == SandboxStatus.STOPPED:
            return ToolResult.failure(
                called_name(tool_name),
                f"sandbox {sandbox_id} is stopped; nothing was executed (its files and "
                "variables are gone, a new sandbox is needed)",
            )
        if not entry.gone:
            result = await entry.tools.execute(tool_name, parameters)
            if result.status != "error":
                return result
            await self._refresh(entry)  # did the call fail because the sandbox is gone?
            if not entry.gone:
                return result
        return ToolResult.failure(
            tool_name,
            f"sandbox {sandbox_id} cannot run anything any more: {entry.error}; nothing was "
            "executed. It must be recreated: delete_sandbox it and call create_sandbox.",
            metadata={"state_lost": True},
        )

    async def get_stats(self) -> dict[str, Any]:
        """Counts by status and type (the engine is asked about each live sandbox)."""
        await asyncio.gather(*(self._refresh(e) for e in list(self._entries.values())))
        return {
            "manager_type": SandboxManagerType.LOCAL.value,
            "total_sandboxes": len(self._entries),
            "status_counts": dict(Counter(e.status.value for e in self._entries.values())),
            "sandbox_types": dict(Counter(e.type.value for e in self._entries.values())),
            "running": self._running,
        }

    def __repr__(self) -> str:
        return f"<SandboxManager {len(self._entries)} sandboxes>"


#: ms-enclave's name for the in-process manager.
LocalSandboxManager = SandboxManager


class SandboxManagerFactory:
    """Creates managers by type, as in ms-enclave; ``create_manager()`` gives a local one."""

    _registry: dict[SandboxManagerType, type[SandboxManager]] = {
        SandboxManagerType.LOCAL: SandboxManager
    }

    @classmethod
    def register(cls, manager_type: SandboxManagerType, manager_class: type) -> None:
        """Make a manager class available under a type."""
        cls._registry[manager_type] = manager_class

    @classmethod
    def create_manager(
        cls,
        manager_type: SandboxManagerType | str | None = None,
        config: SandboxManagerConfig | None = None,
        **kwargs: Any,
    ) -> ManagerLike:
        """A new manager; use it with ``async with`` so its sandboxes are removed."""
        if kwargs.get("base_url") or manager_type == SandboxManagerType.HTTP:
            from .client.manager import HttpSandboxManager

            if not kwargs.get("base_url"):
                raise ConfigError("an HTTP manager needs base_url='http://host:port'")
            return HttpSandboxManager(config, **kwargs)
        kwargs.pop("base_url", None)
        try:
            kind = SandboxManagerType(manager_type or SandboxManagerType.LOCAL)
        except ValueError:
            known = ", ".join(t.value for t in cls._registry)
            raise ConfigError(
                f"unknown manager type {manager_type!r}; use one of: {known}"
            ) from None
        return cls._registry[kind](config, **kwargs)

    @classmethod
    def get_registered_types(cls) -> list[SandboxManagerType]:
        """Manager types that can be created."""
        return list(cls._registry)


def register_manager(manager_type: SandboxManagerType) -> Any:
    """Class decorator registering a manager type with the factory."""

    def decorator(manager_class: type) -> type:
        SandboxManagerFactory.register(manager_type, manager_class)
        return manager_class

    return decorator


if TYPE_CHECKING:  # mypy holds the local manager to the seam

    def _is_manager_like(manager: SandboxManager) -> ManagerLike:
        return manager
