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
from .. import replicas
from ..tenancy import Lease, Tenancy
from .shared import SHARED_FIELDS, RecordStore, Stamp

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
    """The E2B sandboxes of every key, and their timeouts.

    With several workers or replicas (``tenancy.shared``) the records are kept on the
    shared record directory too (:mod:`.shared`) and read again at every call, so any
    process serves any E2B sandbox; one process at a time ends those past their timeout
    (the reaper's turn)."""

    def __init__(self, tenancy: Tenancy, templates: Mapping[str, str]) -> None:
        self.tenancy = tenancy
        #: E2B template name -> image.
        self.templates = dict(templates)
        self._sandboxes: dict[str, E2bSandbox] = {}
        self._store = RecordStore(tenancy.settings.record_dir) if tenancy.shared else None
        #: The stamp of the shared file each record was last read from or written to.
        self._stamps: dict[str, Stamp | None] = {}
        self._expiry: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start ending sandboxes whose timeout passed (the app's lifespan calls this)."""
        if self._expiry is None:
            self._expiry = asyncio.create_task(self._expire_forever())

    async def stop(self) -> None:
        """Stop the expiry task and every command and watcher of this process (the
        sandboxes go with the tenancy; with several processes the others serve them
        on)."""
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
            self._expiry = None
        while self._sandboxes:
            await self._stop_streams(self._sandboxes.popitem()[1])

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.expire()
            except Exception:  # the loop must outlive any one failure
                log.exception("ending E2B sandboxes past their timeout failed")

    async def expire(self, now: float | None = None) -> list[str]:
        """End every sandbox past its timeout; returns their ids.  With several
        processes, the one whose turn it is to reap does it."""
        now = time.time() if now is None else now

        def due() -> list[E2bSandbox]:
            ids = list(self._sandboxes) if self._store is None else self._store.ids()
            found = (self._find(sid) for sid in ids)
            return [r for r in found if r is not None and r.end_at <= now and not r.paused]

        if not due():
            return []
        async with self.tenancy.reaper_turn() as mine:
            done = due() if mine else []  # read again: changed meanwhile, maybe
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

    async def add(self, record: E2bSandbox) -> None:
        """Keep a sandbox the control API just created (removed again if its record
        cannot be kept)."""
        self._sandboxes[record.id] = record
        try:
            self.save(record)
        except SandboxError:
            self._sandboxes.pop(record.id, None)
            with contextlib.suppress(SandboxError):
                await self.tenancy.delete(record.owner, record.id)
            raise

    def save(self, record: E2bSandbox) -> None:
        """Share what changed in a record (its timeout, say) with the other processes."""
        if self._store is not None:
            fields = {name: getattr(record, name) for name in SHARED_FIELDS}
            self._stamps[record.id] = self._store.save(fields)

    def ends_at(self, record: E2bSandbox, end_at: float) -> None:
        """A sandbox's new end (unix time), for every process."""
        record.end_at = end_at
        self.save(record)

    def _find(self, sandbox_id: str) -> E2bSandbox | None:
        """A record by id, as the shared store has it now when there is one."""
        cached = self._sandboxes.get(sandbox_id)
        if self._store is None:
            return cached
        stamp = self._store.stamp(sandbox_id)
        if stamp is None:  # ended by another process
            if cached is not None:
                self._drop(cached)
            return None
        if cached is not None and self._stamps.get(sandbox_id) == stamp:
            return cached
        loaded = self._store.load(sandbox_id)
        if loaded is None:
            return cached
        self._stamps[sandbox_id], fields = loaded
        if cached is None:
            cached = self._sandboxes[sandbox_id] = E2bSandbox(**fields)
            return cached
        if fields["paused"] and not cached.paused:  # paused by another process
            asyncio.get_running_loop().create_task(self._stop_streams(cached))
        for name in SHARED_FIELDS:  # in place: commands and watchers hold the record
            setattr(cached, name, fields[name])
        return cached

    def _drop(self, record: E2bSandbox) -> None:
        """This process stops serving a record (its streams end)."""
        self._sandboxes.pop(record.id, None)
        self._stamps.pop(record.id, None)
        asyncio.get_running_loop().create_task(self._stop_streams(record))

    def _owned(self, owner: str, sandbox_id: str) -> E2bSandbox:
        """The caller's record; another key's is as unknown as none."""
        record = self._find(sandbox_id)
        if record is None or record.owner != owner:
            raise SandboxNotFoundError(f"sandbox {sandbox_id!r} not found")
        return record

    async def record(self, owner: str, sandbox_id: str) -> E2bSandbox:
        """The caller's E2B sandbox, running or paused; another key's is as unknown as
        none."""
        record = self._owned(owner, sandbox_id)
        if not record.paused:
            await self._lease(record)  # gone another way: not found
        return record

    async def get(self, owner: str, sandbox_id: str) -> tuple[E2bSandbox, Lease]:
        """The caller's running E2B sandbox and its lease."""
        record = self._owned(owner, sandbox_id)
        if record.paused:
            raise SandboxNotFoundError(f"The sandbox {sandbox_id} is paused: connect resumes it")
        return record, await self._lease(record)

    def owned(self, owner: str) -> list[E2bSandbox]:
        """The caller's E2B sandboxes, running and paused (with several processes, the
        running ones any process serves)."""
        ids = list(self._sandboxes) if self._store is None else self._store.ids()
        found = (self._find(sid) for sid in ids)
        return [
            r
            for r in found
            if r is not None and r.owner == owner and (r.paused or self._running(r))
        ]

    def _running(self, record: E2bSandbox) -> bool:
        """Whether a record's sandbox runs (on any process; without adopting it here)."""
        if self._store is not None:
            state = replicas.state_path(self.tenancy.settings.record_dir, record.owner, record.id)
            return state is not None and replicas.is_live(state)
        try:
            self._local_lease(record)
        except SandboxNotFoundError:
            return False
        return True

    async def _lease(self, record: E2bSandbox) -> Lease:
        """The tenancy's lease of a running record (adopted here first, with several
        processes: a record whose sandbox went another way stays until its timeout
        ends it); SandboxNotFoundError when it is gone."""
        if self._store is None:
            return self._local_lease(record)
        try:
            return await self.tenancy.live(record.owner, record.id)
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"The sandbox {record.id} was not found") from None

    def _local_lease(self, record: E2bSandbox) -> Lease:
        try:
            return self.tenancy.get(record.owner, record.id)
        except SandboxNotFoundError:
            # removed another way (idle reaper, /v1 delete): the E2B side goes too
            self._drop(record)
            raise SandboxNotFoundError(f"The sandbox {record.id} was not found") from None

    def owner_of(self, scope: Scope) -> str | None:
        """The key that owns the sandbox a call into ``/e2b/sandbox`` names (None for
        none): the per-key caps count such a call against it (see
        :class:`~..limits.KeyConcurrency`); :meth:`resolve` still checks its token."""
        for name, value in scope.get("headers", []):
            if name.lower() == b"e2b-sandbox-id":
                record = self._find(value.decode("latin-1"))
                return None if record is None else record.owner
        return None

    async def resolve(
        self, headers: Mapping[str, str], *, port: int, token_required: bool = True
    ) -> tuple[E2bSandbox, Lease]:
        """The sandbox a call into ``/e2b/sandbox`` is for, by E2B's routing headers.

        ``E2b-Sandbox-Id`` names it; ``X-Access-Token`` must be its envd token (when
        ``token_required``, or whenever one is sent).  Raises ``SandboxNotFoundError``
        (404) or :class:`~kernel_sandbox.errors.AccessDeniedError` (401).
        """
        sandbox_id = headers.get("e2b-sandbox-id", "")
        record = self._find(sandbox_id)
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
        return record, await self._lease(record)

    async def kill(self, record: E2bSandbox) -> None:
        """Remove a sandbox (a paused one's saved state too); its notebook stays."""
        await self.forget(record.id)
        if record.paused:
            await self.tenancy.durable.delete_paused(record.owner, record.id)
            return
        with contextlib.suppress(SandboxNotFoundError):
            await self.tenancy.delete(record.owner, record.id)

    async def pause(self, record: E2bSandbox) -> None:
        """Pause a running sandbox: commands and watchers end, its state is saved (its
        calls wait meanwhile, on any process)."""
        await self._stop_streams(record)
        record.paused = True  # first: a call meanwhile, on any process, must not resume it
        self.save(record)
        try:
            async with self.tenancy.use(record.owner, record.id, serial=True) as lease:
                await self.tenancy.durable.pause(lease)
        except BaseException:
            record.paused = False
            with contextlib.suppress(SandboxError):
                self.save(record)
            raise

    async def resume(self, record: E2bSandbox, timeout: float) -> Lease:
        """Bring a paused sandbox back, with ``timeout`` seconds to live."""
        lease = await self.tenancy.live(record.owner, record.id)
        record.paused = False
        self.ends_at(record, time.time() + timeout)
        return lease

    async def forget(self, sandbox_id: str) -> None:
        """Drop the E2B side of a sandbox (its commands and watchers stop), in every
        process."""
        record = self._sandboxes.pop(sandbox_id, None)
        self._stamps.pop(sandbox_id, None)
        if self._store is not None:
            self._store.remove(sandbox_id)
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
