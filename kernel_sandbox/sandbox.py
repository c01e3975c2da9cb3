"""AsyncSandbox: a kernel session, a lock and events, on a kernel host.

The host (:class:`~kernel_sandbox.backends.base.KernelHost`, found by name: ``docker``
by default) owns everything engine-specific: where the kernel runs, how it is reached,
how it is restarted, how processes and files beside it are run and moved.  The sandbox
holds the one jupyter_client session to the kernel, runs one request at a time, turns
raw replies into :class:`~kernel_sandbox.results.Execution` results (the verdict itself
is :mod:`~kernel_sandbox.judgement`'s), restarts a kernel that died or got stuck, and
emits an event for everything it does (see :mod:`~kernel_sandbox.events`), whoever
called it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import posixpath
import secrets
import time
from typing import TYPE_CHECKING, Any

from .backends.base import KernelHost
from .backends.factory import HostFactory, make_host
from .config import LABEL_PREFIX, PING_TIMEOUT, SandboxConfig
from .errors import (
    ConfigError,
    ContainerStoppedError,
    FileOperationError,
    KernelError,
    SandboxClosedError,
    SandboxError,
    SandboxNotFoundError,
    SandboxStartError,
    SnapshotError,
)
from .events import (
    EgressRefused,
    Event,
    KernelRestarted,
    Listener,
    PythonExecuted,
    ShellExecuted,
    current_context,
    emit,
)
from .files import AsyncFiles
from .judgement import judge
from .kernel.client import KernelSession, OutputCallback
from .kernel.connection import ConnectionInfo
from .limits import MAX_SNAPSHOT_BYTES, MAX_SNAPSHOT_FILES, MAX_SNAPSHOT_REPORT_BYTES
from .results import CommandResult, Execution
from .shell import run_command
from .snapshots.model import Snapshot
from .snapshots.portable import Restored, load_snapshot, take_snapshot
from .snapshots.store import SnapshotStore, default_store

if TYPE_CHECKING:
    from .protocols import SandboxLike

__all__ = ["PING_TIMEOUT", "AsyncSandbox"]

log = logging.getLogger(__name__)


class AsyncSandbox:
    """A stateful Python sandbox: one persistent kernel, with shell and files beside it.

    Create one with :meth:`create` (or ``async with await AsyncSandbox.create()``);
    :meth:`close` removes everything its host made for it.
    """

    def __init__(self, config: SandboxConfig, host: KernelHost, sandbox_id: str) -> None:
        self.config = config
        self.id = sandbox_id
        #: The kernel host that runs this sandbox (engine-specific; see ``backends``).
        self.host = host
        self.files = AsyncFiles(self)
        self._session: KernelSession | None = None
        self._info: ConnectionInfo | None = None
        #: Restarts done since the last events went out (emitted after the call's own).
        self._restarts: list[KernelRestarted] = []
        self._lock = asyncio.Lock()
        self._closed = False
        #: Why calls are refused before :meth:`close` ran (released to a pool).
        self._retired = ""
        self.created_at = time.time()
        #: Called with every :mod:`~kernel_sandbox.events` event of this sandbox.
        self.listeners: list[Listener] = []
        #: What :meth:`restore` (or :meth:`resume`) brought back into this sandbox.
        self.restored: Restored | None = None

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        config: SandboxConfig | None = None,
        *,
        host: str | HostFactory | None = None,
        **overrides: Any,
    ) -> AsyncSandbox:
        """Start a sandbox with a ready kernel; ``overrides`` change single settings.

        ``host`` picks the kernel host: a registered name (``"docker"``, ``"local"``,
        ...) or a factory such as ``functools.partial(DockerHost, client=...)``;
        by default ``config.host``.
        """
        config = (config or SandboxConfig()).with_overrides(**overrides)
        return await cls._start(config, host, secrets.token_hex(6))

    @classmethod
    async def _start(
        cls, config: SandboxConfig, host: str | HostFactory | None, sandbox_id: str
    ) -> AsyncSandbox:
        sandbox = cls(config, make_host(host, sandbox_id, config), sandbox_id)
        try:
            await sandbox._connect(await sandbox.host.launch())
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    @classmethod
    async def adopt(
        cls,
        sandbox_id: str,
        config: SandboxConfig | None = None,
        *,
        host: str | HostFactory | None = None,
        own: bool = True,
        labels: dict[str, str] | None = None,
        interrupt: bool = False,
    ) -> AsyncSandbox:
        """Reconnect to a running sandbox another process started; its kernel keeps running.

        The sandbox is found by its id label (and ``labels``, e.g. a server's name) on
        the host's engine; its variables, processes and files are all still there.
        ``own=True`` takes it over: :meth:`close` removes it (the way a restarted server
        adopts what its killed predecessor left).  ``own=False`` attaches as a guest
        beside a live owner: :meth:`close` only disconnects, and restarts are refused.
        Settings the container was made with (transport, user, working directory,
        network) come from the engine; the rest (timeouts, limits on output) from
        ``config``.  A busy kernel answers nobody until its cell ends: with ``interrupt``
        the cell running now is interrupted first (a dead owner's call, which no one
        waits for any more).  Raises :class:`~kernel_sandbox.errors.SandboxNotFoundError`
        when no running sandbox has that id.
        """
        config = config or SandboxConfig()
        made = make_host(host, sandbox_id, config)
        wanted = {**(labels or {}), f"{LABEL_PREFIX}.id": sandbox_id}
        records = [r for r in await type(made).list_sandboxes(wanted) if r.running]
        if not records:
            raise SandboxNotFoundError(f"no running sandbox {sandbox_id!r} was found")
        info = await made.attach(records[0], own=own)
        sandbox = cls(made.config, made, sandbox_id)
        try:
            if interrupt:
                with contextlib.suppress(KernelError):  # no kernel: the connect says so
                    await made.interrupt()
            await sandbox._connect(info)
        except BaseException as exc:  # unreachable now is not gone: remove nothing, let go
            sandbox._closed = True
            await made.detach()
            if isinstance(exc, SandboxStartError):
                raise SandboxStartError(
                    f"could not reach the kernel of sandbox {sandbox_id} within "
                    f"{config.startup_timeout:g}s: a kernel busy with a long cell answers "
                    "only when it ends (interrupt=True interrupts it first); it was left "
                    f"as it was ({exc})"
                ) from exc
            raise
        return sandbox

    @property
    def image(self) -> str:
        """The image the kernel runs in (after any derivation)."""
        return self.host.image

    @property
    def container_id(self) -> str | None:
        """The engine's id of what runs the sandbox (container id, pod name...)."""
        return self.host.resource_id

    @property
    def connection_info(self) -> ConnectionInfo | None:
        """How this process reaches the kernel (Jupyter connection-file fields, seen from
        here), e.g. to attach another Jupyter client; None before the first start."""
        return self._info

    @property
    def working_dir(self) -> str:
        """Where relative paths start inside the sandbox (the host's working directory)."""
        return self.host.working_dir

    @property
    def labels(self) -> dict[str, str]:
        """Labels put on everything the host made, so orphans can always be found."""
        return self.host.labels

    async def _connect(self, info: ConnectionInfo) -> None:
        """Connect to the kernel that starts now; tell the host when the attempt is over."""
        self._info = info
        session = KernelSession(info, self.config.max_output_bytes)
        try:
            await session.connect(self.config.startup_timeout, self.host.poll)
        except KernelError as exc:
            session.close()
            logs = await self._logs_tail()
            raise SandboxStartError(
                f"the kernel in image {self.image!r} did not start: {exc}{logs}"
            ) from exc
        except BaseException:  # cancelled: an unclosed client hangs zmq when collected
            session.close()
            raise
        else:
            self._session = session
        finally:  # connected or not: a kernel that never came must not leave a way in
            await self.host.post_launch()

    async def _logs_tail(self) -> str:
        try:
            text = (await self.host.logs(tail=15)).strip()
        except Exception:  # the start error is what matters; the log is a bonus
            return ""
        return f"\ncontainer log (last lines):\n{text}" if text else ""

    async def close(self) -> None:
        """Remove everything the host made for this sandbox.  Safe twice."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            self._session.close()
            self._session = None
        await self.host.cleanup()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def check_open(self) -> None:
        """Raise :class:`SandboxClosedError` once the sandbox is closed (or retired)."""
        if self._retired:
            raise SandboxClosedError(f"sandbox {self.id} {self._retired}")
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one")

    def retire(self, why: str) -> None:
        """Refuse every later call at once, with ``why``, while :meth:`close` is still to
        come (a pool closes released sandboxes in the background)."""
        self._retired = why

    # -- health ------------------------------------------------------------------

    async def health(self) -> str | None:
        """None while the sandbox can run code, else a sentence saying why it cannot.

        Asks the engine now (one call), so it tells a stopped or removed container, or
        an engine that went away; for pools, managers and error messages.
        """
        if self._closed:
            return "it was closed"
        try:
            state = await self.host.state()
        except Exception as exc:  # the engine itself is unreachable
            return f"the engine cannot be asked about it: {exc}"
        return None if state.running else state.death_reason()

    async def ping(self, timeout: float = PING_TIMEOUT) -> bool:
        """True when the kernel answers within ``timeout`` seconds.

        Cheap while the kernel is idle (one kernel_info round trip, no engine call);
        a kernel reported dead ends the wait early.  A busy kernel does not answer
        until its cell ends: ping an idle sandbox.
        """
        session = self._session
        if session is None or self._closed:
            return False
        step = min(0.25, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await session.ping(step):
                return True
            if await self.host.poll() is not None:
                return False
        return False

    async def warm_up(self) -> None:
        """Have the kernel do the first-call work now (off a later caller's path)."""
        self.check_open()
        if self._session is not None:
            await self._session.warm_up()

    async def _emit(self, event: Event) -> None:
        if self.listeners:
            await emit(self.listeners, event)

    async def _emit_restarts(self, *, requested: bool) -> None:
        restarts, self._restarts = self._restarts, []
        for event in restarts:
            context = current_context()
            await self._emit(dataclasses.replace(event, requested=requested, metadata=context))

    async def _emit_refusals(self) -> None:
        """Tell listeners (the notebook) what the host's egress proxy refused in the call."""
        refused = self.host.egress_refusals()
        if refused:
            policy = str(self.config.network)
            await self._emit(EgressRefused(self.id, tuple(refused), policy))

    # -- python ------------------------------------------------------------------

    async def run_python(
        self,
        code: str,
        timeout: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> Execution:
        """Run code in the persistent kernel; variables survive between calls.

        Never raises for anything the code does: exceptions, timeouts and kernel
        crashes come back as the ``status`` of the :class:`Execution`.  Output over
        ``config.max_output_bytes`` keeps its head and tail; ``truncated_bytes`` of
        the result counts what was dropped.
        """
        self.check_open()
        timeout = timeout or self.config.timeout
        async with self._lock:  # one request at a time: outputs never interleave
            self.check_open()
            wall, started = time.time(), time.monotonic()
            execution = None
            restarted = ""  # what a restart before this call lost
            if self._session is None:  # an earlier restart failed (e.g. engine down): try again
                outcome = await self._try_restart()
                if self._session is None:
                    execution = Execution("kernel_died", state_lost=True, message=outcome)
                else:
                    restarted = outcome
            if execution is None:
                assert self._session is not None
                raw = await self._session.execute(
                    code,
                    timeout=timeout,
                    interrupt_grace=self.config.interrupt_grace,
                    check_alive=self.host.poll,
                    on_output=on_output,
                    max_output_bytes=self.config.max_output_bytes,
                )
                execution = judge(raw, timeout, time.monotonic() - started)
                if execution.state_lost:  # stuck or dead: restart it, say how that went
                    outcome = await self._try_restart()
                    execution = dataclasses.replace(
                        execution,
                        message=f"{execution.message}; {outcome}",
                        duration=time.monotonic() - started,
                    )
                elif restarted:
                    execution = dataclasses.replace(
                        execution,
                        state_lost=True,
                        message=f"the kernel had stopped before this call: {restarted}",
                    )
        await self._emit(PythonExecuted(self.id, code, execution, wall, current_context()))
        await self._emit_restarts(requested=False)
        await self._emit_refusals()
        return execution

    async def _try_restart(self) -> str:
        """Restart the kernel; return a sentence saying what was lost, or why it failed."""
        try:
            return await self._restart_kernel()
        except SandboxError as exc:
            return f"restarting the kernel failed: {exc}"

    async def _restart_kernel(self, kill_all: bool = False) -> str:
        """Restart the kernel in place, else the whole sandbox; say what was lost.

        ``kill_all`` ends every process of the sandbox, not only the kernel's.  The
        whole restart is the fallback for a host that stopped (its supervisor was
        killed) or a supervisor that cannot start a new kernel in time.
        """
        if self._session is not None:
            self._session.close()
            self._session = None
        started = time.time()
        try:
            await self._connect(await self.host.restart_kernel(kill_all=kill_all))
            message = "the kernel was restarted and all variables were lost"
            self._restarts.append(KernelRestarted(self.id, message, False, started))
            return message
        except SandboxError as exc:
            # A stopped container (e.g. gVisor's whole-sandbox OOM kill) needs no more words
            stopped = isinstance(exc.__cause__, ContainerStoppedError)
            why = "its container had stopped" if stopped else str(exc)
        log.warning("sandbox %s: restarting the whole sandbox: %s", self.id, why)
        try:
            info = await self.host.restart_whole()
        except Exception as exc:
            raise KernelError(
                f"the kernel could not be restarted in place ({why}), "
                f"nor could the container: {exc}"
            ) from exc
        await self._connect(info)
        message = (
            f"the kernel could not be restarted in place ({why}), so the whole container "
            "was restarted: all variables were lost, and files written in the sandbox may "
            "be lost too"
        )
        self._restarts.append(KernelRestarted(self.id, message, True, started))
        return message

    async def interrupt(self) -> None:
        """Interrupt the cell running now (``KeyboardInterrupt`` in it); variables stay.

        Not serialised with other calls (the cell holds the lock): it signals the
        kernel as jupyter_client does a kernel with ``interrupt_mode: signal``.  An idle
        kernel ignores it.  Raises :class:`~kernel_sandbox.errors.KernelError` when no
        kernel runs.
        """
        self.check_open()
        await self.host.interrupt()

    async def restart(self) -> None:
        """Restart the kernel: every variable is lost, files in the sandbox are kept.

        Every process in the sandbox ends too, including what shell commands left
        running in the background.
        """
        self.check_open()
        async with self._lock:
            try:
                await self._restart_kernel(kill_all=True)
            finally:
                await self._emit_restarts(requested=True)

    # -- durable state: snapshot, restore, fork, pause, resume ----------------------------

    async def snapshot(
        self,
        name: str | None = None,
        exact: bool | None = None,
        *,
        store: SnapshotStore | None = None,
        tmp: bool = False,
        max_bytes: int = MAX_SNAPSHOT_BYTES,
    ) -> Snapshot:
        """Save the sandbox's state into ``store`` (default: :func:`default_store`).

        Portable (every host): the working directory, ``$HOME`` (packages installed
        at run time included), ``/tmp`` with ``tmp=True``, and every variable of the
        kernel, pickled *inside* the sandbox by dill one at a time; a variable that
        cannot be saved (an open file, a socket, a thread, a generator...) is listed
        in :attr:`Snapshot.not_saved` with the reason, modules are re-imported by name.
        The host stores the blob as opaque bytes, at most ``max_bytes`` and
        :data:`~kernel_sandbox.limits.MAX_SNAPSHOT_FILES` entries, with its digest.
        ``exact=True`` asks for the whole memory (a runtime checkpoint), which no host
        offers yet: it raises :class:`~kernel_sandbox.errors.SnapshotError`.  The
        sandbox runs on, unchanged (its history and execution count too).
        """
        self.check_open()
        async with self._lock:
            self.check_open()
            return await self._snapshot(name, exact, store, tmp, max_bytes, paused=None)

    async def _snapshot(
        self,
        name: str | None,
        exact: bool | None,
        store: SnapshotStore | None,
        tmp: bool,
        max_bytes: int,
        paused: str | None,
    ) -> Snapshot:
        if exact:
            raise SnapshotError(
                f"the {self.host.name or type(self.host).__name__} host cannot take exact "
                "snapshots (a runtime checkpoint of the whole memory); use exact=None for "
                "a portable one"
            )
        if self._session is None:
            raise SnapshotError(f"sandbox {self.id} has no running kernel to snapshot")
        store = store or default_store()
        base = {
            "sandbox_id": self.id,
            "image": self.image,
            # the host by the name it runs under, so a restore picks the same kind
            "config": {**self.config.model_dump(mode="json"), "host": self._host_factory()},
            "name": name,
            "owner": store.owner or "",
            "paused": paused,
            "parent": self.restored.snapshot_id if self.restored else None,
        }
        return await take_snapshot(
            self.host,
            self._run_hidden,
            store,
            base,
            places=self.host.snapshot_places(tmp),
            max_bytes=max_bytes,
            max_entries=MAX_SNAPSHOT_FILES,
        )

    async def _run_hidden(self, code: str, timeout: float) -> str:
        """Run the machinery's code in the kernel (no history, no events); its stdout."""
        assert self._session is not None
        raw = await self._session.execute(
            code,
            timeout=timeout,
            interrupt_grace=self.config.interrupt_grace,
            check_alive=self.host.poll,
            max_output_bytes=MAX_SNAPSHOT_REPORT_BYTES,
            store_history=False,
        )
        errors = [f"{o['ename']}: {o['evalue']}" for o in raw.outputs if "ename" in o]
        if raw.outcome != "finished" or errors:
            why = raw.death_reason or "; ".join(errors) or raw.outcome
            raise SnapshotError(f"the kernel of sandbox {self.id} did not finish: {why}")
        return "".join(str(o["text"]) for o in raw.outputs if o.get("name") == "stdout")

    @classmethod
    async def restore(
        cls,
        snapshot: Snapshot | str,
        *,
        store: SnapshotStore | None = None,
        host: str | HostFactory | None = None,
        **overrides: Any,
    ) -> AsyncSandbox:
        """A new sandbox with a snapshot's state: files, variables, modules.

        ``snapshot`` is a :class:`Snapshot` or its id in ``store``; its settings are
        used, changed by ``overrides``.  The blob is checked against its digest as it
        goes in (a changed blob is refused and the new sandbox removed); the variables
        are loaded inside the new kernel.  What could not be loaded is in
        :attr:`restored` (``restored.failed``).
        """
        store = store or default_store()
        snap_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        snap = await store.get(snap_id)  # the store's record, checked for its owner
        return await cls._restore(snap, store, host, secrets.token_hex(6), overrides)

    @classmethod
    async def _restore(
        cls,
        snap: Snapshot,
        store: SnapshotStore,
        host: str | HostFactory | None,
        sandbox_id: str,
        overrides: dict[str, Any],
    ) -> AsyncSandbox:
        config = SandboxConfig(**snap.config).with_overrides(**overrides)
        sandbox = await cls._start(config, host, sandbox_id)
        try:
            async with sandbox._lock:
                places = sandbox.host.snapshot_places(tmp=True)
                sandbox.restored = await load_snapshot(
                    sandbox.host, sandbox._run_hidden, store, snap, places=places
                )
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def fork(self, n: int, *, store: SnapshotStore | None = None) -> list[AsyncSandbox]:
        """``n`` new, independent sandboxes with this one's state (one snapshot, ``n``
        restores); this one runs on.  If one cannot start, those made are removed."""
        if n < 1:
            raise ConfigError(f"fork(n={n}): n must be at least 1")
        store = store or default_store()
        snap = await self.snapshot(name=f"fork of {self.id}", store=store)
        made = await asyncio.gather(
            *(self.restore(snap, store=store) for _ in range(n)),
            return_exceptions=True,
        )
        failed = [m for m in made if isinstance(m, BaseException)]
        forks = [m for m in made if isinstance(m, AsyncSandbox)]
        if failed:
            await asyncio.gather(*(f.close() for f in forks), return_exceptions=True)
            raise failed[0]
        return forks

    def _host_factory(self) -> str:
        return self.host.name or self.config.host

    async def pause(self, *, store: SnapshotStore | None = None, tmp: bool = True) -> Snapshot:
        """Save the state (a snapshot, ``/tmp`` included), then remove the container:
        its memory is freed.  :meth:`resume` with this sandbox's id brings it back
        under the same id.  A pause that fails leaves the sandbox running."""
        self.check_open()
        store = store or default_store()
        async with self._lock:
            self.check_open()
            snap = await self._snapshot(None, None, store, tmp, MAX_SNAPSHOT_BYTES, self.id)
            self.retire("was paused; AsyncSandbox.resume(id) brings it back")
        for older in await store.list():  # one pause state per sandbox: the newest
            if older.paused == self.id and older.id != snap.id:
                await store.delete(older.id)
        await self.close()
        return snap

    @classmethod
    async def resume(
        cls,
        sandbox_id: str,
        *,
        store: SnapshotStore | None = None,
        host: str | HostFactory | None = None,
        **overrides: Any,
    ) -> AsyncSandbox:
        """Bring back a paused sandbox, under the same id, with its state.

        The pause snapshot is consumed (deleted once the sandbox is back).  Raises
        :class:`~kernel_sandbox.errors.SnapshotNotFoundError` when the store holds no
        paused sandbox of that id.
        """
        store = store or default_store()
        snap = await store.paused(sandbox_id)
        sandbox = await cls._restore(snap, store, host, sandbox_id, overrides)
        await store.delete(snap.id)
        return sandbox

    # -- shell -------------------------------------------------------------------

    async def run_shell(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run a shell command beside the kernel as the sandbox user.

        On timeout the whole process group of the command is killed.  stdout and
        stderr each keep at most ``config.max_output_bytes`` (head and tail);
        ``truncated_bytes`` of the result counts what was dropped.
        """
        self.check_open()
        wall = time.time()
        outcome = await run_command(
            self.host,
            command,
            timeout=timeout or self.config.timeout,
            workdir=self.resolve_path(cwd or "."),
            env=env,
            max_output_bytes=self.config.max_output_bytes,
        )
        await self._emit(ShellExecuted(self.id, command, outcome, wall, cwd, current_context()))
        await self._emit_refusals()
        return outcome

    def resolve_path(self, path: str) -> str:
        """An absolute path in the sandbox; relative paths start at the working directory.

        A NUL byte can be in no path; refused here, it would otherwise reach the engine,
        whose error names the host's storage directories.
        """
        if "\0" in path:
            raise FileOperationError(f"a path cannot contain a NUL byte: {path!r}")
        return posixpath.normpath(posixpath.join(self.host.working_dir, path))

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<AsyncSandbox {self.id} image={self.image!r} {state}>"


if TYPE_CHECKING:  # mypy holds the local sandbox to the seam

    def _is_sandbox_like(sandbox: AsyncSandbox) -> SandboxLike:
        return sandbox
