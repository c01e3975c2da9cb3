"""Which sandbox an MCP tool call runs in.

Over stdio one process is one sandbox (:class:`StdioSandbox`), started on the first
call.  Over HTTP (:class:`SessionSandboxes`) a call names a ``sandbox_id`` its key owns
(one that ``create_sandbox`` returned), else it runs in its MCP session's sandbox —
and protocol 2026-07-28 has no sessions: every call arrives on its own, so a call
without a session and without an id runs in the *key's* MCP sandbox, one per API key,
kept across calls.  Sandboxes come from the server's tenancy, so its per-key cap and
idle reaping clean them up.  Every sandbox is recorded as a notebook.

A tool call over HTTP runs in the MCP session manager's task group, started with the
server (not in the request's task), so it would not inherit the request's
:func:`~kernel_sandbox.threads.owned_by`: each call's work is owned by its key here,
so one key's long MCP calls take its own worker threads, never another key's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..config import SandboxConfig
from ..notebook.recorder import NotebookRecorder, new_session_path
from ..notebook.storage import sessions_dir
from ..sandbox import AsyncSandbox
from ..threads import owned_by

__all__ = ["KEY_SANDBOX", "NamedSandboxes", "SandboxSource", "SessionSandboxes", "StdioSandbox"]

#: What stands for the MCP session of a call that has none (protocol 2026-07-28):
#: such calls share their API key's MCP sandbox.
KEY_SANDBOX = "(no MCP session: the key's sandbox)"
#: Bytes of a session's sandbox id read back from its name file (ids are at most 64).
_NAME_BYTES = 128


class SandboxSource(Protocol):
    """Hands a tool call the sandbox it runs in."""

    def sandbox(
        self, ctx: Any, sandbox_id: str | None
    ) -> contextlib.AbstractAsyncContextManager[AsyncSandbox]: ...


@runtime_checkable
class NamedSandboxes(SandboxSource, Protocol):
    """A source whose callers may start and remove sandboxes of their own by id."""

    async def create(self, ctx: Any) -> str: ...

    async def remove(self, ctx: Any, sandbox_id: str) -> None: ...


def default_record_dir() -> Path:
    """Where stdio sessions are recorded: ``sessions_dir("mcp-sessions")``."""
    return sessions_dir("mcp-sessions")


class StdioSandbox:
    """One sandbox for the whole process, recorded to ``record_path``."""

    def __init__(self, config: SandboxConfig, record_path: Path | None = None) -> None:
        self.config = config
        self.record_path = record_path or new_session_path(default_record_dir(), "mcp")
        self._sandbox: AsyncSandbox | None = None
        self._recorder: NotebookRecorder | None = None
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def sandbox(self, ctx: Any, sandbox_id: str | None) -> AsyncIterator[AsyncSandbox]:
        """The process's sandbox (an id other than its own is refused)."""
        async with self._lock:
            if self._sandbox is None:
                self._sandbox = await AsyncSandbox.create(self.config)
                self._recorder = NotebookRecorder.attach(
                    self._sandbox, self.record_path, title="MCP session (stdio)"
                )
        if sandbox_id not in (None, "", self._sandbox.id):
            raise LookupError(f"this MCP server has one sandbox, {self._sandbox.id}")
        yield self._sandbox

    async def close(self) -> None:
        """Remove the sandbox; the notebook stays."""
        if self._recorder is not None:
            self._recorder.finish("completed", "MCP session ended")
        if self._sandbox is not None:
            await self._sandbox.close()


class SessionSandboxes:
    """Sandboxes of the server's tenancy for MCP over HTTP: named, per session, per key."""

    def __init__(self, tenancy: Any, keyring: Any) -> None:
        self.tenancy = tenancy
        self.keyring = keyring
        self._by_session: dict[tuple[str, str], str] = {}
        #: One per key (a bounded set): a key's slow create never holds another's call.
        self._locks: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(
            asyncio.Lock
        )

    def _owner(self, ctx: Any) -> str:
        owner = self.keyring.identify_scope(ctx.request_context.request.scope)
        if owner is None:  # the middleware refused such requests already
            raise PermissionError("missing or wrong API key")
        return str(owner)

    async def _new(self, owner: str, **metadata: str) -> str:
        from ..server.policy import client_config

        cfg, notes = client_config({}, self.tenancy.settings)
        lease = await self.tenancy.create(owner, cfg, "docker", notes)
        lease.recorder.set_metadata(**metadata)
        return str(lease.id)

    async def create(self, ctx: Any) -> str:
        """A new sandbox of the caller's key (the ``create_sandbox`` tool)."""
        owner = self._owner(ctx)
        with owned_by(owner):
            return await self._new(owner, mcp_session="create_sandbox")

    async def remove(self, ctx: Any, sandbox_id: str) -> None:
        """Remove a sandbox of the caller's key (another key's is unknown to it)."""
        owner = self._owner(ctx)
        with owned_by(owner):
            await self.tenancy.delete(owner, sandbox_id)

    @contextlib.asynccontextmanager
    async def sandbox(self, ctx: Any, sandbox_id: str | None) -> AsyncIterator[AsyncSandbox]:
        """The named sandbox of the caller's key, else its MCP session's, else the key's;
        held as a recorded call (with several workers, the call lock: cells keep the
        calls' order whichever worker ran them)."""
        owner = self._owner(ctx)
        with owned_by(owner):
            if not sandbox_id:
                sandbox_id = await self._session_sandbox(owner, ctx)
            async with self.tenancy.use(owner, sandbox_id, serial=True) as lease:
                yield lease.sandbox

    async def _session_sandbox(self, owner: str, ctx: Any) -> str:
        """The caller's MCP session's sandbox (the key's, for a call without a
        session), made on its first call and again once it is gone."""
        session = str((ctx.headers or {}).get("mcp-session-id") or KEY_SANDBOX)
        async with self._locks[owner]:
            if self.tenancy.shared:  # no sessions there: a session header names nothing
                return await self._shared_key_sandbox(owner)
            sandbox_id = self._by_session.get((owner, session))
            live = {lease.id for lease in self.tenancy.owned(owner)}
            if sandbox_id is None or sandbox_id not in live:
                for known, sid in list(self._by_session.items()):  # sessions that ended
                    if known[0] == owner and sid not in live:
                        del self._by_session[known]
                sandbox_id = await self._new(owner, mcp_session=session)
                self._by_session[(owner, session)] = sandbox_id
        return sandbox_id

    async def _shared_key_sandbox(self, owner: str) -> str:
        """Several workers or replicas (which serve MCP without sessions: any of them
        answers any request): the key's MCP sandbox is named in a file of the key's
        record directory, ``.mcp-sandbox`` (one per key, whatever session header a
        client sends), so every process finds the same one; one
        process at a time (that file's flock) looks and, when it is gone, makes the
        next."""
        from ..server import replicas

        record_dir = self.tenancy.settings.record_dir
        folder = record_dir / owner
        await asyncio.to_thread(folder.mkdir, mode=0o700, parents=True, exist_ok=True)
        busy = "another server process is making this key's MCP sandbox"
        wait = self.tenancy.settings.max_timeout
        async with replicas.locked_file(folder / ".mcp-sandbox", wait, busy) as fd:
            named = os.pread(fd, _NAME_BYTES, 0).decode(errors="replace").strip()
            state = replicas.state_path(record_dir, owner, named)
            if state is not None and replicas.is_live(state):
                return named
            made = await self._new(owner, mcp_session=KEY_SANDBOX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, made.encode(), 0)
            return made
