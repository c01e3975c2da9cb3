"""Tenancy: which key owns which sandbox, per-key caps, idle reaping, recording.

Every sandbox the server starts goes through one :class:`~kernel_sandbox.SandboxManager`
(the same one an in-process program uses) and is owned by the key that created it.  A
key sees and touches only its own sandboxes: another key's id answers 404, exactly like
an id that does not exist.  Each sandbox carries the labels ``kernel-sandbox.server``
(the server's name) and ``kernel-sandbox.server-key-id`` (its owner's key id, never the
key), so a restarted server finds what a killed one left.  Every sandbox is recorded by
a :class:`~kernel_sandbox.notebook.NotebookRecorder` (crash-safe: the notebook is
rewritten atomically, within ``record_flush_delay`` of each step and at once when the
sandbox goes).  With several workers (``serve --workers N``, :mod:`.replicas`) any worker
serves any sandbox: one another worker made is adopted on demand, recorded calls take
the sandbox's call lock, and the reaper's clock is the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import rundirs
from ..errors import (
    CapacityError,
    ConfigError,
    KernelError,
    SandboxError,
    SandboxNotFoundError,
)
from ..limits import LIVE_CALL_OUTPUT_BYTES
from ..manager import DockerSandboxConfig, SandboxManager, SandboxManagerConfig
from ..notebook.cells import META_KEY
from ..notebook.recorder import NotebookRecorder
from ..sandbox import AsyncSandbox
from . import replicas
from .durable import Durability, Paused
from .election import ReaperElection, orphans
from .image_queue import ImageQueue
from .labels import SERVER_ID_LABEL, SERVER_KEY_LABEL, SERVER_LABEL
from .policy import client_config
from .recording import record_pending, record_sandbox
from .settings import ServerSettings

if TYPE_CHECKING:
    from ..snapshots import Snapshot
    from .restart import Restorable

__all__ = [
    "SERVER_ID_LABEL",
    "SERVER_KEY_LABEL",
    "SERVER_LABEL",
    "Lease",
    "Tenancy",
]

log = logging.getLogger(__name__)


@dataclass
class Lease:
    """One sandbox as the server sees it: owner, kind, use, notebook."""

    id: str
    owner: str
    kind: str
    sandbox: AsyncSandbox
    recorder: NotebookRecorder
    notes: list[str] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    #: Taken warm from the server's pool (no owner label on its container then).
    pooled: bool = False
    #: The /v1 Python call running now, for the live page: code and outputs so far.
    running: dict[str, Any] | None = None
    #: With several workers: the sandbox's state file (:mod:`.replicas`) and the
    #: generation this lease serves (another after a pause and resume).
    state: Path | None = None
    generation: str = ""
    #: With several workers: this worker's calls queue here before the call lock.
    serial: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Attached beside a live owner (another worker): it cannot restart the kernel, and
    #: removing the sandbox goes through the engine's labels.
    guest: bool = False
    #: A guest's claim on the sandbox's run directory (gc keeps what is claimed).
    claim: int | None = None

    def watch_outputs(self, code: str) -> Callable[[dict[str, Any]], None]:
        """Start showing a running call on the live page; returns its ``on_output``.

        The page keeps at most ``LIVE_CALL_OUTPUT_BYTES`` of its outputs (the result has them all).
        """
        live: dict[str, Any] = {"code": code, "outputs": [], "bytes": 0}
        self.running = live
        self.recorder.nudge()

        def on_output(output: dict[str, Any]) -> None:
            size = len(str(output))
            if live["bytes"] + size <= LIVE_CALL_OUTPUT_BYTES:
                live["bytes"] += size
                live["outputs"].append(output)
                self.recorder.nudge()

        return on_output

    def done_running(self) -> None:
        """The call ended (its cell is recorded now)."""
        self.running = None
        self.recorder.nudge()

    @property
    def notebook_path(self) -> Path:
        """The session notebook of this sandbox (valid after every step)."""
        return self.recorder.path


class Tenancy:
    """Creates, finds, reaps and removes the sandboxes of every key."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        labels = {SERVER_LABEL: settings.name}
        pool_config = client_config({}, settings)[0]  # what a client omitting fields gets
        self.manager = SandboxManager(
            SandboxManagerConfig(
                labels=labels,
                max_sandboxes=settings.max_sandboxes,
                pool_size=settings.pool_size,
                pool_config=pool_config if settings.pool_size else None,
            )
        )
        self.pool_config = pool_config
        self._leases: dict[str, Lease] = {}
        self._pools: dict[str, list[str]] = {}  # owner -> ids of its ms-enclave pool
        self._pool_free: dict[str, asyncio.Queue[str]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._election: ReaperElection | None = None
        self._creating: dict[str, int] = {}
        self._images = ImageQueue()
        self._adopting: dict[str, asyncio.Lock] = {}
        #: Snapshots, paused sandboxes, restores and forks (see :mod:`.durable`).
        self.durable = Durability(self)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Deal with a killed predecessor's sandboxes, start the pool and the reaper.

        Adoption comes first and the pool last: what is adopted is kept, what is left
        of the old run is removed, and the new pool is never mistaken for it.
        """
        from .restart import (
            adopt_all,
            remove_leftovers,
            restorable,
            restore_all,
        )

        found: list[Restorable] = []
        if self.settings.on_restart != "keep" and not self.shared:
            # several workers: the supervisor applied the policy once, before them
            adopted: frozenset[str] = frozenset()
            if self.settings.on_restart == "adopt":
                adopted = await adopt_all(self, await restorable(self.settings))
                if adopted:
                    log.warning("adopted %d sandboxes a previous run left", len(adopted))
            if self.settings.on_restart == "restore":
                found = await restorable(self.settings)
            removed = await remove_leftovers(self.settings.name, adopted)
            if removed:
                log.warning("removed %d sandboxes a previous run left", removed)
        await self.manager.start()
        if found:
            await restore_all(self, found)
        await self.durable.load()
        idle = min(t for t in (self.settings.idle_timeout, self.settings.pause_after, 1e9) if t)
        tick = min(30.0, max(idle / 4, 0.2))
        if self.shared:  # one pass at a time, by the process whose turn it is
            self._election = ReaperElection(self.settings, tick)
        # replicas reap orphans even with no idle timeout: a killed replica leaves them
        if self.settings.idle_timeout or self.settings.pause_after or self.settings.replica:
            self._reaper = asyncio.create_task(self._reap_forever(tick))

    @property
    def shared(self) -> bool:
        """Several workers or replicas serve the sandboxes (see :mod:`.replicas`)."""
        return self.settings.workers > 1 or self.settings.replica

    @property
    def keeps_turns(self) -> bool:
        """Workers on one host: a recorded call keeps the notebook's writing turn for the
        calls after it in this worker (written behind, coalescing), handed over at once
        when another worker wants it (a FIFO: one host's kernel).  Replicas, which may
        share the volume across hosts, take and let go of it on every call, unless told
        their volume is one node's (``keep_notebook_turns``)."""
        keep = self.settings.keep_notebook_turns
        if keep is None:
            return self.settings.workers > 1 and not self.settings.replica
        return keep and self.shared

    async def stop(self) -> None:
        """Remove every sandbox (a graceful stop; a killed server leaves them labelled).

        One of several workers only lets go of its sandboxes: the others serve them on
        (the supervisor removes them all when the whole server stops)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._election is not None:
            await self._election.release()
        if self.shared:
            for lease in list(self._leases.values()):
                await self._let_go(lease)
        for lease in list(self._leases.values()):
            await asyncio.to_thread(lease.recorder.finish, "completed", "server stopped")
        await self.manager.stop()
        self._leases.clear()

    async def _reap_forever(self, tick: float) -> None:
        while True:
            await asyncio.sleep(tick)
            try:
                await self.reap_idle()
            except Exception:  # the reaper must outlive any one failure
                log.exception("reaping idle sandboxes failed")

    async def reap_idle(self) -> list[str]:
        """Pause every sandbox unused for ``pause_after`` seconds (when set), else remove
        every one unused for ``idle_timeout``; returns their ids."""
        limit = self.settings.pause_after or self.settings.idle_timeout
        if self.shared:
            return await self._reap_shared(limit)
        if not limit:
            return []
        now = time.monotonic()
        pausing = bool(self.settings.pause_after)
        idle = [  # a sandbox from the warm pool is removed when idle, never paused
            lease
            for lease in self._leases.values()
            if not lease.busy and not (pausing and lease.pooled) and now - lease.last_used > limit
        ]
        for lease in idle:
            if pausing:
                log.info("pausing sandbox %s of key %s: idle", lease.id, lease.owner)
                try:
                    await self.durable.pause(lease)
                except SandboxError as exc:  # it runs on, as if never asked
                    log.warning("could not pause idle sandbox %s: %s", lease.id, exc)
            else:
                log.info("removing sandbox %s of key %s: idle", lease.id, lease.owner)
                await self._remove(lease, "idle timeout")
        return [lease.id for lease in idle]

    @contextlib.asynccontextmanager
    async def reaper_turn(self) -> AsyncIterator[bool]:
        """Whether this process does the chores of every process now (reaping, ending
        E2B sandboxes past their timeout): one process always does; of several, the
        one whose turn it is (:mod:`.election`)."""
        if self._election is None:
            yield True
            return
        async with self._election.turn() as mine:
            yield mine

    async def _reap_shared(self, limit: float | None) -> list[str]:
        """Several workers or replicas: the one whose turn it is (:mod:`.election`)
        removes every sandbox no process used for ``limit`` seconds (None: never) and
        none is calling now (its call lock is free), then the orphans; the others let
        go of the sandboxes another process removed."""
        from .restart import leftovers, remove_one

        assert self._election is not None
        async with self._election.turn() as mine:
            if not mine:
                for lease in list(self._leases.values()):
                    state = lease.state
                    if state is None or lease.busy:
                        continue
                    if replicas.generation(state) != lease.generation:
                        await self._let_go(lease)  # removed (or resumed) elsewhere
                return []
            reaped = await self._reap_idle_shared(limit) if limit else []
            for row in orphans(self.settings, await leftovers(self.settings.name)):
                log.warning("removing sandbox %s: no server process serves it", row.sandbox_id)
                with contextlib.suppress(SandboxError):
                    await remove_one(self.settings.name, row.sandbox_id)
            return reaped

    async def _reap_idle_shared(self, limit: float) -> list[str]:
        """Remove the sandboxes no process used for ``limit`` seconds (this one's turn)."""
        reaped = []
        for owner, sid, state in replicas.live_states(self.settings.record_dir):
            idle = replicas.idle_for(state)
            held = self._leases.get(sid)
            if idle is None or idle <= limit or (held is not None and held.busy):
                continue
            try:
                async with replicas.call_lock(state, 0, block=False):
                    lease = held or await self._adopt_shared(owner, sid, state)
                    log.info("removing sandbox %s of key %s: idle", sid, owner)
                    await self._remove(lease, "idle timeout")
            except CapacityError:  # a call began meanwhile
                continue
            except SandboxNotFoundError:  # gone meanwhile, or no container to adopt
                replicas.drop(state)
            reaped.append(sid)
        return reaped

    async def _let_go(self, lease: Lease) -> None:
        """Stop serving a sandbox here without removing it (another worker serves it,
        or removed it already)."""
        self._leases.pop(lease.id, None)
        self._unclaim(lease)
        try:
            await asyncio.to_thread(lease.recorder.flush)
        except Exception:
            log.warning("could not write the notebook of %s", lease.id, exc_info=True)
        with contextlib.suppress(SandboxError):
            await self.manager.release_sandbox(lease.id)

    def _count(self, owner: str | None = None) -> int:
        """Sandboxes of ``owner`` (None: of every key) that count against the caps: every
        worker's, with several."""
        mine = len(self._leases) if owner is None else len(self.owned(owner))
        if not self.shared:
            return mine
        states = replicas.live_states(self.settings.record_dir)
        return max(mine, len([s for s in states if owner is None or s[0] == owner]))

    def _share(self, lease: Lease) -> None:
        """Several workers: the sandbox is live for every worker from now on."""
        if self.shared:
            lease.state = replicas.state_path(self.settings.record_dir, lease.owner, lease.id)
            if lease.state is not None:
                lease.generation = replicas.mark_live(lease.state)

    async def _adopt_shared(self, owner: str, sandbox_id: str, state: Path) -> Lease:
        """Serve here ``owner``'s sandbox another worker made (once per worker)."""
        from .restart import find_restorable

        async with self._adopting.setdefault(sandbox_id, asyncio.Lock()):
            try:
                lease = self._leases.get(sandbox_id)
                if lease is None:
                    # read before looking for its kernel: were it resumed in between,
                    # the next call finds the generations differ and looks again
                    generation = replicas.generation(state) or ""
                    item = await find_restorable(self.settings, owner, sandbox_id)
                    if item is None:
                        raise SandboxNotFoundError(f"no sandbox {sandbox_id!r} for this API key")
                    # a call whose worker died may still run: the kernel would answer
                    # the attach only when it ends (the call lock's holder notes it)
                    stuck = replicas.holder_died(state)
                    try:  # the owner if its maker died, else a guest beside it
                        lease = await self.adopt(item, interrupt=stuck, note=None)
                    except KernelError:
                        lease = await self.adopt(item, interrupt=stuck, note=None, own=False)
                        lease.claim = replicas.guest_claim(item.run_dir, item.container_sandbox_id)
                    lease.state, lease.generation = state, generation
                    log.info(
                        "serving sandbox %s (key %s) made by another server process",
                        sandbox_id,
                        owner,
                    )
                return lease
            finally:
                self._adopting.pop(sandbox_id, None)

    # -- sandboxes --------------------------------------------------------------------

    def owned(self, owner: str) -> list[Lease]:
        """The sandboxes of one key."""
        return [lease for lease in self._leases.values() if lease.owner == owner]

    async def create(
        self,
        owner: str,
        config: DockerSandboxConfig,
        kind: str = "docker",
        notes: Sequence[str] = (),
        sandbox_id: str | None = None,
    ) -> Lease:
        """Start a sandbox for ``owner`` within the caps; it is recorded from the start."""
        mine = self._count(owner) + self._creating.get(owner, 0)
        if mine >= self.settings.max_sandboxes_per_key:
            raise CapacityError(
                f"this key already has {mine} sandboxes (the server allows "
                f"{self.settings.max_sandboxes_per_key} per key); delete one first"
            )
        if self._count() + sum(self._creating.values()) >= self.settings.max_sandboxes:
            raise CapacityError(
                f"the server runs its maximum of {self.settings.max_sandboxes} sandboxes; "
                "try again later"
            )
        pooled = self.settings.pool_size and _same_sandbox(config, self.pool_config)
        if not pooled:
            labels = {**config.labels, SERVER_KEY_LABEL: owner}
            if sandbox_id is not None:
                labels[SERVER_ID_LABEL] = sandbox_id
            config = config.model_copy(update={"labels": labels})
        self._creating[owner] = self._creating.get(owner, 0) + 1
        try:
            image, derive = config.image, config.derive_image
            new = self._images.is_new(image, config.host, derive)
            async with self._images.turn(owner, image, derive) if new else contextlib.nullcontext():
                sid = await self.manager.create_sandbox("docker", config, sandbox_id)
                self._images.started(image, derive)  # before the turn ends: its waiters go
        finally:
            self._creating[owner] -= 1
        sandbox = await self.manager.get_sandbox(sid)
        path = self.settings.record_dir / owner / f"{sid}.ipynb"
        recorder = await asyncio.to_thread(
            record_sandbox,
            sandbox,
            path,
            f"Sandbox {sid}",
            self._session_metadata(config, kind),
            self.settings.record_flush_delay,
        )
        lease = Lease(sid, owner, kind, sandbox, recorder, list(notes), pooled=bool(pooled))
        self._leases[sid] = lease
        self._share(lease)
        return lease

    async def adopt(
        self,
        item: Restorable,
        *,
        interrupt: bool = True,
        note: str | None = "",
        own: bool = True,
    ) -> Lease:
        """Take over a running sandbox a killed run of this server left, for its owner.

        Its kernel is reconnected, not restarted (variables kept); the call that was
        running is interrupted (unless ``interrupt`` is false: another worker's call);
        its notebook goes on (the old cells stay, see :mod:`kernel_sandbox.notebook.shared`)
        with ``note`` (``""``: the restart's; None: none).  ``own=False``: as a guest
        beside a live owner (another worker that made it).
        """
        from ..notebook.storage import read_notebook

        old = await asyncio.to_thread(read_notebook, item.notebook)
        session = dict(old.metadata.get(META_KEY, {}))
        saved: dict[str, Any] = dict(session.get("server_sandbox") or {})
        raw = {**saved.get("config", {}), "tools_config": saved.get("tools_config")}
        config, notes = client_config(raw, self.settings)
        # its ids as made: a pause snapshot names the server's id of what it holds
        labels = {**config.labels, SERVER_KEY_LABEL: item.owner, SERVER_ID_LABEL: item.sandbox_id}
        config = config.model_copy(update={"labels": labels})
        sandbox = await AsyncSandbox.adopt(
            item.container_sandbox_id,
            config,
            labels={SERVER_LABEL: self.settings.name},
            interrupt=interrupt,
            own=own,
        )
        try:
            self.manager.add_sandbox(sandbox, config, item.sandbox_id)
        except BaseException:
            await sandbox.close()
            raise
        session.pop("status", None)
        session.pop("finished_at", None)
        recorder = await asyncio.to_thread(
            record_sandbox,
            sandbox,
            item.notebook,
            "",
            {**session, "status": "running"},
            self.settings.record_flush_delay,
        )
        if note == "":
            note = (
                "adopted after a server restart: the same kernel (variables kept); the call "
                "running when the server died was interrupted"
            )
        if note is not None:
            await asyncio.to_thread(recorder.add_note, note)
            notes = [*notes, note]
        kind = str(saved.get("kind", "docker"))
        lease = Lease(item.sandbox_id, item.owner, kind, sandbox, recorder, notes)
        lease.pooled, lease.guest = item.pooled, not own
        self._leases[item.sandbox_id] = lease
        if note is not None:  # on demand (another worker's sandbox): routine
            log.warning("adopted sandbox %s for key %s", item.sandbox_id, item.owner)
        return lease

    def _session_metadata(self, config: DockerSandboxConfig, kind: str) -> dict[str, object]:
        """What a restarted server needs to start this sandbox again (``restore``)."""
        return {
            "server": self.settings.name,
            "server_sandbox": {
                "kind": kind,
                "tools_config": config.tools_config,
                "config": config.model_dump(
                    include={
                        "image",
                        "timeout",
                        "memory_limit",
                        "cpu_limit",
                        "network_enabled",
                        "network",
                    }
                ),
            },
        }

    def get(self, owner: str, sandbox_id: str) -> Lease:
        """The caller's sandbox; another key's sandbox is as unknown as a missing one."""
        lease = self._leases.get(sandbox_id) if isinstance(sandbox_id, str) else None
        if lease is None or lease.owner != owner:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r} for this API key")
        return lease

    def paused(self, owner: str, sandbox_id: str) -> Paused | None:
        """The caller's sandbox if it is paused now, else None."""
        paused = self.durable.paused.get(sandbox_id)
        if paused is None or paused.owner != owner or sandbox_id in self._leases:
            return None
        return paused

    async def live(self, owner: str, sandbox_id: str) -> Lease:
        """The caller's sandbox, resumed first if it is paused (the call is just slower);
        with several workers, one another worker made is adopted here first."""
        if not self.shared:
            if self.paused(owner, sandbox_id) is not None:
                return await self.durable.resume(owner, sandbox_id)
            return self.get(owner, sandbox_id)
        state = replicas.state_path(self.settings.record_dir, owner, sandbox_id)
        if state is None:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r} for this API key")
        lease = self._leases.get(sandbox_id)
        generation = replicas.generation(state)
        if lease is not None and lease.owner == owner and lease.generation != generation:
            await self._let_go(lease)  # another worker removed it (and maybe resumed it)
            lease = None
        if generation is None:
            return await self._resume_shared(owner, sandbox_id, state)
        if lease is None:
            lease = await self._adopt_shared(owner, sandbox_id, state)
        return self.get(owner, sandbox_id)

    async def _resume_shared(self, owner: str, sandbox_id: str, state: Path) -> Lease:
        """Several workers: a sandbox no worker serves may be paused (by any of them: the
        snapshot store is shared); one resumes it, the others then serve what it made."""
        missing = SandboxNotFoundError(f"no sandbox {sandbox_id!r} for this API key")
        if await self.durable.find_paused(owner, sandbox_id) is None:
            raise missing
        try:
            async with replicas.resume_turn(state, self.settings.max_timeout):
                if replicas.is_live(state):  # resumed by another worker meanwhile
                    return await self._adopt_shared(owner, sandbox_id, state)
                if await self.durable.find_paused(owner, sandbox_id) is None:
                    raise missing  # resumed and deleted meanwhile
                return await self.durable.resume(owner, sandbox_id)
        except FileNotFoundError:  # the key's directory went: nothing of it is left
            raise missing from None

    async def everyone(self, owner: str) -> list[Lease]:
        """The sandboxes of one key on every worker (adopted here when needed)."""
        if self.shared:
            states = replicas.live_states(self.settings.record_dir)
            for sid in [sid for key, sid, _ in states if key == owner]:
                with contextlib.suppress(SandboxError):
                    await self.live(owner, sid)
        return self.owned(owner)

    def check_room(self, owner: str, extra: int = 0) -> None:
        """Raise CapacityError unless ``owner`` may have ``extra + 1`` more sandboxes."""
        mine = self._count(owner) + self._creating.get(owner, 0) + extra
        if mine >= self.settings.max_sandboxes_per_key:
            raise CapacityError(
                f"this key already has {mine} sandboxes (the server allows "
                f"{self.settings.max_sandboxes_per_key} per key); delete one first"
            )
        if self._count() + sum(self._creating.values()) + extra >= self.settings.max_sandboxes:
            raise CapacityError(
                f"the server runs its maximum of {self.settings.max_sandboxes} sandboxes; "
                "try again later"
            )

    def config_of(self, snap: Snapshot) -> DockerSandboxConfig:
        """The settings a snapshot's sandbox may have now: its own, checked again by the
        server's policy for its owner (a key's ceilings may have dropped since)."""
        from .policy import client_config

        raw = {k: v for k, v in snap.config.items() if k not in ("labels", "volumes")}
        config, _ = client_config(raw, self.settings, snap.owner)
        labels = {SERVER_LABEL: self.settings.name, SERVER_KEY_LABEL: snap.owner}
        return config.model_copy(update={"labels": labels})

    async def attach(
        self,
        sandbox: AsyncSandbox,
        config: DockerSandboxConfig,
        sandbox_id: str,
        owner: str,
        notebook: Path,
        note: str,
        forked_from: dict[str, Any] | None = None,
    ) -> Lease:
        """Serve a sandbox made elsewhere (resumed, restored, forked) for ``owner``; an
        existing ``notebook`` goes on, a new one starts (with its ``forked_from``)."""
        from ..notebook.storage import read_notebook

        try:
            self.manager.add_sandbox(sandbox, config, sandbox_id)
        except BaseException:
            await sandbox.close()
            raise
        session = self._session_metadata(config, "docker")
        if notebook.exists():
            old = await asyncio.to_thread(read_notebook, notebook)
            session = dict(old.metadata.get(META_KEY, {}))
            for stale in ("status", "finished_at", "reason"):
                session.pop(stale, None)
        if forked_from is not None:
            session["forked_from"] = forked_from
        title = "" if notebook.exists() else f"Sandbox {sandbox_id}"  # one heading per notebook
        recorder = await asyncio.to_thread(
            record_sandbox,
            sandbox,
            notebook,
            title,
            {**session, "status": "running"},
            self.settings.record_flush_delay,
        )
        await asyncio.to_thread(recorder.add_note, note)
        lease = Lease(sandbox_id, owner, "docker", sandbox, recorder, [note])
        self._leases[sandbox_id] = lease
        self._share(lease)
        return lease

    async def forget(self, lease: Lease, status: str) -> None:
        """Stop serving a sandbox whose container is gone already (paused)."""
        self._leases.pop(lease.id, None)
        if lease.state is not None:
            replicas.drop(lease.state)
        try:
            await asyncio.to_thread(lease.recorder.finish, status, status)
        except Exception:
            log.warning("could not write the notebook of %s", lease.id, exc_info=True)
        with contextlib.suppress(SandboxError):
            await self._delete_container(lease)

    async def _delete_container(self, lease: Lease) -> None:
        """Remove the sandbox's container, also when this worker serves it as a guest."""
        await self.manager.delete_sandbox(lease.id)
        if lease.guest:  # a guest only disconnected: its owner (a worker) lives on
            from .restart import remove_one

            await remove_one(self.settings.name, lease.sandbox.id)

    @contextlib.asynccontextmanager
    async def use(
        self, owner: str, sandbox_id: str, *, serial: bool = False
    ) -> AsyncIterator[Lease]:
        """Hold a sandbox for one call: it is not reaped meanwhile, and counts as used.

        A paused sandbox is resumed first.  ``serial``: a recorded call (code, shell):
        with several workers it holds the sandbox's call lock until its cell is on
        disk, so cells keep the calls' order whichever worker ran them."""
        lease = await self.live(owner, sandbox_id)
        lease.busy += 1
        try:
            if serial and lease.state is not None:
                async with self._called(lease, lease.state):
                    yield lease
            else:
                yield lease
        finally:
            lease.busy -= 1
            lease.last_used = time.monotonic()
            if lease.state is not None:
                with contextlib.suppress(OSError):
                    os.utime(lease.state)  # the reaper's clock: used now

    @contextlib.asynccontextmanager
    async def _called(self, lease: Lease, state: Path) -> AsyncIterator[None]:
        """A recorded call with several workers: it holds the call lock, and its cells are
        written before any later call's, whichever process makes that one.  Written
        behind, they are written after the answer: the call takes the notebook's
        writing turn before it lets go of the call lock, and writes them in a thread
        after (the next call runs meanwhile; its write waits for this one); with
        workers, it keeps the turn for its worker's next calls (:meth:`keeps_turns`)."""
        async with lease.serial, replicas.call_lock(state, self.settings.max_timeout) as died:
            if died:  # its worker died mid-call: nobody waits for that call any more
                log.warning("a worker died during a call to %s: interrupting it", lease.id)
                with contextlib.suppress(SandboxError):
                    await lease.sandbox.interrupt()
                    # the kernel aborts what was queued behind the interrupted cell
                    # (stop_on_error): a silent cell takes that, not this call
                    await lease.sandbox.warm_up()
                await asyncio.to_thread(
                    lease.recorder.add_note,
                    "a server worker died during a call: that call was interrupted "
                    "(the same kernel, variables kept)",
                )
            try:
                yield
            finally:
                # Every cell of the call in memory now, before anything is awaited (a
                # cancelled call too), then the turn: the hand-over of a kept turn marks
                # itself before it copies the cells, so a turn found kept writes these.
                record_pending(lease.sandbox)
                if lease.recorder.flush_delay is None:  # each step written already
                    await asyncio.to_thread(lease.recorder.flush)
                elif self.keeps_turns:
                    if not lease.recorder.keeps_turn:  # else kept since an earlier call
                        await _keep_turn(lease)
                else:
                    await _turn_then_write(lease)

    async def delete(self, owner: str, sandbox_id: str) -> None:
        """Remove the caller's sandbox (paused or not); its notebook stays."""
        if sandbox_id not in self._leases and await self.durable.delete_paused(owner, sandbox_id):
            return
        await self._remove(await self.live(owner, sandbox_id), "deleted")

    async def stop_one(self, owner: str, sandbox_id: str) -> None:
        """ms-enclave's stop: the container goes, the record stays (status stopped)."""
        lease = await self.live(owner, sandbox_id)
        if lease.state is not None:
            replicas.drop(lease.state)
        await asyncio.to_thread(lease.recorder.finish, "completed", "stopped")
        await self.manager.stop_sandbox(sandbox_id)

    @staticmethod
    def _unclaim(lease: Lease) -> None:
        if lease.claim is not None:
            rundirs.release(lease.claim)
            lease.claim = None

    async def _remove(self, lease: Lease, why: str) -> None:
        self._leases.pop(lease.id, None)
        self._unclaim(lease)
        if lease.state is not None:
            replicas.drop(lease.state)
        for ids in self._pools.values():
            if lease.id in ids:
                ids.remove(lease.id)
        try:
            await asyncio.to_thread(lease.recorder.finish, "completed", why)
        except Exception:  # the notebook of every earlier step is on disk already
            log.warning("could not finish the notebook of %s", lease.id, exc_info=True)
        try:
            await self._delete_container(lease)
        except SandboxError as exc:
            log.warning("removing sandbox %s: %s", lease.id, exc)

    # -- ms-enclave's pool ------------------------------------------------------------

    async def init_pool(
        self,
        owner: str,
        size: int,
        config: DockerSandboxConfig,
        kind: str,
        notes: list[str],
    ) -> list[str]:
        """Start ``size`` sandboxes that ``/pool/execute`` hands out one call at a time."""
        leases = await asyncio.gather(
            *(self.create(owner, config, kind, notes) for _ in range(size)),
            return_exceptions=True,
        )
        made = [lease for lease in leases if isinstance(lease, Lease)]
        failures = [exc for exc in leases if isinstance(exc, BaseException)]
        if failures and not made:
            raise failures[0]
        queue = self._pool_free.setdefault(owner, asyncio.Queue())
        for lease in made:
            self._pools.setdefault(owner, []).append(lease.id)
            queue.put_nowait(lease.id)
        return [lease.id for lease in made]

    @contextlib.asynccontextmanager
    async def pooled(self, owner: str, wait: float) -> AsyncIterator[Lease]:
        """A free sandbox of the caller's pool for one call (TimeoutError after ``wait``)."""
        if not self._pools.get(owner):
            raise ConfigError("the sandbox pool is empty; call POST /pool/initialize first")
        queue = self._pool_free[owner]
        while True:
            sid = await asyncio.wait_for(queue.get(), wait)
            if sid in self._pools.get(owner, []):
                break
        try:
            async with self.use(owner, sid) as lease:
                yield lease
        finally:
            if sid in self._pools.get(owner, []):
                queue.put_nowait(sid)


async def _turn_then_write(lease: Lease) -> None:
    """Take the notebook's writing turn, then (after returning) write the call's cells,
    in one executor thread: a cancelled caller never leaves the turn taken."""
    loop = asyncio.get_running_loop()
    taken = asyncio.Event()
    recorder = lease.recorder

    def turn_then_write() -> None:
        recorder.take_turn()
        loop.call_soon_threadsafe(taken.set)
        recorder.flush_turn()

    def written(done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.warning("writing the notebook of %s failed", lease.id, exc_info=done.exception())
            taken.set()

    writing = loop.run_in_executor(None, turn_then_write)
    writing.add_done_callback(written)
    try:
        await asyncio.shield(taken.wait())
    except asyncio.CancelledError:  # the call lock still goes only once the turn is taken
        await taken.wait()
        raise


async def _keep_turn(lease: Lease) -> None:
    """Keep the notebook's writing turn (waiting for it in a thread; a cancelled caller
    still waits: the call lock is let go only once the turn is this worker's)."""
    keeping = asyncio.get_running_loop().run_in_executor(None, lease.recorder.keep_turn)
    try:
        await asyncio.shield(keeping)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await keeping
        raise
    except Exception:
        log.warning("taking the notebook's turn of %s failed", lease.id, exc_info=True)


def _same_sandbox(config: DockerSandboxConfig, pool: DockerSandboxConfig) -> bool:
    skip = {"tools_config", "labels"}
    return config.model_dump(exclude=skip) == pool.model_dump(exclude=skip)
