"""HttpSandboxManager: ms-enclave's manager API against a ``kernel-sandbox serve`` host.

``SandboxManagerFactory.create_manager(base_url=..., api_key=...)`` returns one, as
ms-enclave's factory does.  It speaks ms-enclave's REST routes, so it also works
against ms-enclave's own server; :meth:`get_sandbox` hands out a
:class:`~.remote.RemoteSandbox` for direct use (kernel-sandbox servers only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx2

from ..config import SandboxConfig
from ..manager_models import SandboxInfo, SandboxStatus, SandboxType
from ..tools.results import ToolResult
from .remote import RemoteSandbox, raise_for

__all__ = ["HttpSandboxManager"]


class HttpSandboxManager:
    """The manager API over HTTP; removes the sandboxes it created when the block ends."""

    def __init__(
        self,
        config: Any = None,
        *,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._client = httpx2.AsyncClient(
            base_url=self.base_url,
            headers={"X-API-Key": api_key} if api_key else {},
            timeout=httpx2.Timeout(timeout, connect=10),
        )
        self._created: list[str] = []

    async def __aenter__(self) -> HttpSandboxManager:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Check that the server answers (and takes the key)."""
        raise_for(await self._client.get("/health"), f"reach {self.base_url}")

    async def stop(self) -> None:
        """Remove the sandboxes this manager created, then close the connection."""
        try:
            await self.cleanup_all_sandboxes()
        finally:
            await self._client.aclose()

    async def create_sandbox(
        self,
        sandbox_type: SandboxType | str = SandboxType.DOCKER,
        config: SandboxConfig | dict[str, Any] | None = None,
        sandbox_id: str | None = None,
    ) -> str:
        """Start a sandbox on the server (its policy applies); returns its id."""
        body = config.model_dump(exclude_none=True) if isinstance(config, SandboxConfig) else config
        response = await self._client.post(
            "/sandbox/create", params={"sandbox_type": str(sandbox_type)}, json=body or {}
        )
        raise_for(response, "create a sandbox")
        sid = str(response.json()["sandbox_id"])
        self._created.append(sid)
        return sid

    async def get_sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        """Status, image and tools of one sandbox."""
        response = await self._client.get(f"/sandbox/{sandbox_id}")
        raise_for(response, f"sandbox {sandbox_id}")
        return _info(response.json())

    async def list_sandboxes(self, status_filter: SandboxStatus | None = None) -> list[SandboxInfo]:
        """Every sandbox of this API key on the server."""
        params = {"status": status_filter.value} if status_filter else {}
        response = await self._client.get("/sandboxes", params=params)
        raise_for(response, "list sandboxes")
        return [_info(row) for row in response.json()]

    async def stop_sandbox(self, sandbox_id: str) -> bool:
        """Stop a sandbox (container removed, record kept)."""
        raise_for(await self._client.post(f"/sandbox/{sandbox_id}/stop"), f"stop {sandbox_id}")
        return True

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Remove a sandbox."""
        raise_for(await self._client.delete(f"/sandbox/{sandbox_id}"), f"delete {sandbox_id}")
        if sandbox_id in self._created:
            self._created.remove(sandbox_id)
        return True

    async def cleanup_all_sandboxes(self) -> None:
        """Remove every sandbox this manager created (already gone ones are skipped)."""
        for sid in list(self._created):
            response = await self._client.delete(f"/sandbox/{sid}")
            if response.status_code not in (200, 404):
                raise_for(response, f"delete {sid}")
            self._created.remove(sid)

    async def get_sandbox_tools(self, sandbox_id: str) -> dict[str, Any]:
        """``{name: OpenAI function schema}`` of the sandbox's tools."""
        response = await self._client.get(f"/sandbox/{sandbox_id}/tools")
        raise_for(response, f"tools of {sandbox_id}")
        return response.json()  # type: ignore[no-any-return]

    async def execute_tool(
        self, sandbox_id: str, tool_name: str, parameters: dict[str, Any] | None
    ) -> ToolResult:
        """Run one tool call; failures of the call are ``status="error"`` results."""
        body = {"sandbox_id": sandbox_id, "tool_name": tool_name, "parameters": parameters or {}}
        response = await self._client.post("/sandbox/tool/execute", json=body)
        raise_for(response, f"{tool_name} in {sandbox_id}")
        data = response.json()
        return ToolResult.model_validate(
            {k: v for k, v in data.items() if k in ToolResult.model_fields}
        )

    async def get_stats(self) -> dict[str, Any]:
        """The server's counts for this key."""
        response = await self._client.get("/stats")
        raise_for(response, "stats")
        return {**response.json(), "manager_type": "http", "base_url": self.base_url}

    async def get_sandbox(self, sandbox_id: str) -> RemoteSandbox:
        """The sandbox behind an id, with the local ``AsyncSandbox`` API."""
        return await RemoteSandbox.connect(self.base_url, sandbox_id, api_key=self.api_key)


def _info(data: dict[str, Any]) -> SandboxInfo:
    data = dict(data)
    data["type"] = SandboxType.DOCKER  # docker_notebook sandboxes are docker sandboxes here
    return SandboxInfo.model_validate(data)


if TYPE_CHECKING:  # mypy holds the remote manager to the seam
    from ..protocols import ManagerLike

    def _is_manager_like(manager: HttpSandboxManager) -> ManagerLike:
        return manager
