"""What the E2B API knows of a sandbox beyond the tenancy's lease, and who may reach it.

An E2B sandbox is an ordinary lease of the server's :class:`~..tenancy.Tenancy` (same
keys, caps, recording, idle reaping; it shows on ``/v1`` too) plus what E2B's API
adds: the template it was asked for, metadata, environment variables for commands,
an end time (its timeout), and the **envd access token** E2B's SDK receives at create
and sends back on every call into the sandbox (``X-Access-Token``).  Calls into a
sandbox (``/e2b/sandbox/...``) carry no API key: the SDK sends that token and the
``E2b-Sandbox-Id`` header, so those routes are checked here instead of by the API-key
middleware.  The code interpreter's ``/contexts`` calls carry no token at all (E2B's
SDK sends none there); for them the sandbox id itself is the secret: E2B sandboxes
get ids of 96 random bits, shown only to their owner.

The registry also ends sandboxes whose timeout passed (killed, or paused where the
durable-sessions API can), checking once a second.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ...errors import AccessDeniedError, SandboxError, SandboxNotFoundError
from ...limits import E2B_METRICS_SAMPLES
from ..tenancy import Lease, Tenancy

if TYPE_CHECKING:
    from starlette.types import Scope

    from .filesystem import Watcher
    from .models import SandboxMetric
    from .process import Command

__all__ = ["ENVD_PORT", "JUPYTER_PORT", "E2bRegistry", "E2bSandbox", "new_id"]

log = logging.getLogger(__name__)

#: The ports E2B's SDK names in ``E2b-Sandbox-Port``: envd, and the code interpreter.
ENVD_PORT = 49983
JUPYTER_PORT = 49999


def new_id() -> str:
    """A sandbox id of 96 random bits (24 hex digits): unguessable, as a capability."""
    return secrets.token_hex(12)


@dataclass
class E2bSandbox:
    """One sandbox created through the E2B API."""

    id: str
    owner: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    cpu_count: int
    memory_mb: int
    disk_mb: int
    end_at: float
    on_timeout: Literal["kill", "pause"] = "kill"
    #: Paused (its state in the key's store, no container) until connect resumes it.
    paused: bool = False
    access_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    started_at: float = field(default_factory=time.time)
    commands: dict[int, Command] = field(default_factory=dict)
    watchers: dict[str, Watcher] = field(default_factory=dict)
    #: The metrics samples taken so far, the newest last (at most E2B_METRICS_SAMPLES).
    samples: collections.deque[SandboxMetric] = field(
        default_factory=lambda: collections.deque(maxlen=E2B_METRICS_SAMPLES)
    )
    #: The default contexts E2B lists (python, and javascript where the image has it)
    #: were made: once, at the first listing.
    default_contexts: bool = False

    def token_ok(self, given: str | None) -> bool:
        """Whether ``given`` is this sandbox's envd access token (constant time)."""
        return given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogateescape"), self.access_token.encode()
        )


class E2bRegistry:
    """The E2B sandboxes of every key, and their timeouts."""

    def __init__(self, tenancy: Tenancy, templates: Mapping[str, str]) -> None:
        self.tenancy = tenancy
        #: E2B template name -> image.
        self.templates = dict(templates)
        self._sandboxes: dict[str, E2bSandbox] = {}
        self._expiry: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start ending sandboxes whose timeout passed (the app's lifespan calls this)."""
        if self._expiry is None:
            self._expiry = asyncio.create_task(self._expire_forever())

    async def stop(self) -> None:
        """Stop the expiry task and every command and watcher (the sandboxes go with the
        tenancy)."""
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
            self._expiry = None
        for record in list(self._sandboxes.values()):
            await self.forget(record.id)

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.expire()
            except Exception:  # the loop must outlive any one failure
                log.exception("ending E2B sandboxes past their timeout failed")

    async def expire(self, now: float | None = None) -> list[str]:
        """End every sandbox past its timeout; returns their ids."""
        now = time.time() if now is None else now
        done = [r for r in self._sandboxes.values() if r.end_at <= now and not r.paused]
        for record in done:
            log.info("E2B sandbox %s reached its timeout: %s", record.id, record.on_timeout)
            if record.on_timeout == "pause":
                try:
                    await self.pause(record)
                    continue
                except SandboxError:
                    log.exception("pausing E2B sandbox %s failed: killing it", record.id)
            await self.kill(record)
        return [r.id for r in done]

    # -- sandboxes ---------------------------------------------------------------------

    def add(self, record: E2bSandbox) -> None:
        """Keep a sandbox the control API just created."""
        self._sandboxes[record.id] = record

    def record(self, owner: str, sandbox_id: str) -> E2bSandbox:
        """The caller's E2B sandbox, running or paused; another key's is as unknown as
        none."""
        record = self._sandboxes.get(sandbox_id)
        if record is None or record.owner != owner:
            raise SandboxNotFoundError(f"sandbox {sandbox_id!r} not found")
        if not record.paused:
            self._lease(record)  # gone another way: not found
        return record

    def get(self, owner: str, sandbox_id: str) -> tuple[E2bSandbox, Lease]:
        """The caller's running E2B sandbox and its lease."""
        record = self.record(owner, sandbox_id)
        if record.paused:
            raise SandboxNotFoundError(f"The sandbox {sandbox_id} is paused: connect resumes it")
        return record, self._lease(record)

    def owned(self, owner: str) -> list[E2bSandbox]:
        """The caller's E2B sandboxes, running and paused."""
        found = []
        for record in list(self._sandboxes.values()):
            if record.owner == owner:
                with contextlib.suppress(SandboxNotFoundError):
                    found.append(self.record(owner, record.id))
        return found

    def _lease(self, record: E2bSandbox) -> Lease:
        try:
            return self.tenancy.get(record.owner, record.id)
        except SandboxNotFoundError:
            # removed another way (idle reaper, /v1 delete): the E2B side goes too
            self._sandboxes.pop(record.id, None)
            asyncio.get_running_loop().create_task(self._stop_streams(record))
            raise SandboxNotFoundError(f"The sandbox {record.id} was not found") from None

    def owner_of(self, scope: Scope) -> str | None:
        """The key that owns the sandbox a call into ``/e2b/sandbox`` names (None for
        none): the per-key caps count such a call against it (see
        :class:`~..limits.KeyConcurrency`); :meth:`resolve` still checks its token."""
        for name, value in scope.get("headers", []):
            if name.lower() == b"e2b-sandbox-id":
                record = self._sandboxes.get(value.decode("latin-1"))
                return None if record is None else record.owner
        return None

    def resolve(
        self, headers: Mapping[str, str], *, port: int, token_required: bool = True
    ) -> tuple[E2bSandbox, Lease]:
        """The sandbox a call into ``/e2b/sandbox`` is for, by E2B's routing headers.

        ``E2b-Sandbox-Id`` names it; ``X-Access-Token`` must be its envd token (when
        ``token_required``, or whenever one is sent).  Raises ``SandboxNotFoundError``
        (404) or :class:`~kernel_sandbox.errors.AccessDeniedError` (401).
        """
        sandbox_id = headers.get("e2b-sandbox-id", "")
        record = self._sandboxes.get(sandbox_id)
        if record is None:  # E2B's proxy's words, which its SDK recognises
            raise SandboxNotFoundError(f"The sandbox {sandbox_id} was not found")
        wanted = headers.get("e2b-sandbox-port", str(port))
        if wanted != str(port):
            raise SandboxNotFoundError(
                f"The sandbox {sandbox_id} is running but port is not open: {wanted} (only "
                f"envd on {ENVD_PORT} and the code interpreter on {JUPYTER_PORT} are served)"
            )
        if record.paused:
            raise SandboxNotFoundError(f"The sandbox {sandbox_id} was not found (it is paused)")
        token = headers.get("x-access-token")
        if (token_required or token is not None) and not record.token_ok(token):
            raise AccessDeniedError("missing or wrong envd access token (X-Access-Token)")
        return record, self._lease(record)

    async def kill(self, record: E2bSandbox) -> None:
        """Remove a sandbox (a paused one's saved state too); its notebook stays."""
        await self.forget(record.id)
        if record.paused:
            await self.tenancy.durable.delete_paused(record.owner, record.id)
            return
        with contextlib.suppress(SandboxNotFoundError):
            await self.tenancy.delete(record.owner, record.id)

    async def pause(self, record: E2bSandbox) -> None:
        """Pause a running sandbox: commands and watchers end, its state is saved."""
        await self._stop_streams(record)
        await self.tenancy.durable.pause(self.tenancy.get(record.owner, record.id))
        record.paused = True

    async def resume(self, record: E2bSandbox, timeout: float) -> Lease:
        """Bring a paused sandbox back, with ``timeout`` seconds to live."""
        lease = await self.tenancy.durable.resume(record.owner, record.id)
        record.paused = False
        record.end_at = time.time() + timeout
        return lease

    async def forget(self, sandbox_id: str) -> None:
        """Drop the E2B side of a sandbox (its commands and watchers stop)."""
        record = self._sandboxes.pop(sandbox_id, None)
        if record is not None:
            await self._stop_streams(record)

    @staticmethod
    async def _stop_streams(record: E2bSandbox) -> None:
        for command in list(record.commands.values()):
            await command.stop()
        for watcher in list(record.watchers.values()):
            await watcher.stop()
        record.commands.clear()
        record.watchers.clear()

    def all(self) -> list[E2bSandbox]:
        """Every E2B sandbox of every key (for tests and the server's own use)."""
        return list(self._sandboxes.values())
