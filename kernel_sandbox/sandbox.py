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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .backends.base import KernelHost
from .backends.factory import HostFactory, make_host
from .config import LABEL_PREFIX, PING_TIMEOUT, SandboxConfig
from .contexts import (
    DEFAULT_CONTEXT,
    KERNELSPECS_SCRIPT,
    Context,
    KernelSpecInfo,
    kernel_for,
    normalise_language,
    parse_kernelspecs,
)
from .errors import (
    ConfigError,
    ContextNotFoundError,
    FileOperationError,
    KernelError,
    SandboxClosedError,
    SandboxNotFoundError,
    SandboxStartError,
    SnapshotError,
)
from .events import (
    ContextChanged,
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
from .kernel.client import OutputCallback
from .kernel.connection import IPYTHON_KERNEL, ConnectionInfo
from .limits import (
    MAX_CONTEXTS,
    MAX_KERNELSPECS_BYTES,
    MAX_SNAPSHOT_BYTES,
    MAX_SNAPSHOT_FILES,
    MAX_SNAPSHOT_REPORT_BYTES,
)
from .results import CommandResult, Execution, format_size
from .running import RunningKernel
from .shell import run_command
from .snapshots.exact import load_connection, restore_into, save_checkpoint
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
        #: The sandbox's own kernel (the default context), then every other context's.
        self._kernel = RunningKernel(host, config, sandbox_id, config.kernel)
        self._contexts: dict[str, tuple[Context, RunningKernel]] = {}
        #: The image's kernelspecs, once asked (they do not change while it runs).
        self._kernelspecs: dict[str, KernelSpecInfo] | None = None
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
        cls,
        config: SandboxConfig,
        host: str | HostFactory | None,
        sandbox_id: str,
        prepare: Callable[[KernelHost], None] | None = None,
    ) -> AsyncSandbox:
        sandbox = cls(config, make_host(host, sandbox_id, config), sandbox_id)
        try:
            if prepare is not None:
                prepare(sandbox.host)
            await sandbox._kernel.connect(await sandbox.host.launch())
            if config.kernel != IPYTHON_KERNEL:
                await sandbox.kernelspecs()  # its language is in its kernelspec
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
            await sandbox._kernel.connect(info)
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
        return self._kernel.info

    @property
    def working_dir(self) -> str:
        """Where relative paths start inside the sandbox (the host's working directory)."""
        return self.host.working_dir

    @property
    def labels(self) -> dict[str, str]:
        """Labels put on everything the host made, so orphans can always be found."""
        return self.host.labels

    async def close(self) -> None:
        """Remove everything the host made for this sandbox.  Safe twice."""
        if self._closed:
            return
        self._closed = True
        for _, kernel in self._contexts.values():
            kernel.close()
            with contextlib.suppress(Exception):  # the sandbox's cleanup removes it anyway
                await kernel.host.cleanup()
        self._contexts.clear()
        self._kernel.close()
        await self.host.cleanup()

    async def detach(self) -> None:
        """Let go of the sandbox without removing it: it runs on (e.g. after a CLI
        command restored it); :meth:`adopt` takes it over again.  Calls are refused."""
        if self._closed:
            return
        self._closed = True
        for _, kernel in self._contexts.values():
            kernel.close()
        self._kernel.close()
        await self.host.detach()

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
        session = self._kernel.session
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
        if self._kernel.session is not None and self.config.kernel == IPYTHON_KERNEL:
            await self._kernel.session.warm_up()

    async def _emit(self, event: Event) -> None:
        if self.listeners:
            await emit(self.listeners, event)

    async def _emit_restarts(self, *, requested: bool) -> None:
        restarts: list[KernelRestarted] = []
        for kernel in [self._kernel, *(k for _, k in self._contexts.values())]:
            restarts, kernel.restarts = restarts + kernel.restarts, []
        for event in restarts:
            context = current_context()
            await self._emit(dataclasses.replace(event, requested=requested, metadata=context))

    async def _emit_refusals(self) -> None:
        """Tell listeners (the notebook) what the host's egress proxy refused in the call."""
        refused = self.host.egress_refusals()
        if refused:
            policy = str(self.config.network)
            await self._emit(EgressRefused(self.id, tuple(refused), policy))

    # -- code ----------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        language: str | None = None,
        *,
        context: Context | str | None = None,
        timeout: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> Execution:
        """Run ``code`` in a persistent kernel; its variables survive between calls.

        ``context`` (a :class:`~kernel_sandbox.contexts.Context` or its id) picks the
        kernel; else ``language`` (``"python"``, ``"r"``, ``"javascript"``,
        ``"typescript"``, ``"bash"``) picks the first context of that language, the
        sandbox's own kernel if it speaks it, else one made now; with neither, the
        sandbox's own kernel.  Never raises for anything the code does: exceptions,
        timeouts and kernel crashes come back as the ``status`` of the
        :class:`Execution`.  Output over ``config.max_output_bytes`` keeps its head and
        tail; ``truncated_bytes`` of the result counts what was dropped.  Raises
        :class:`~kernel_sandbox.errors.ConfigError` for a language the image has no
        kernel for, :class:`~kernel_sandbox.errors.ContextNotFoundError` for an unknown
        context.
        """
        self.check_open()
        timeout = timeout or self.config.timeout
        if context is None:
            chosen = await self._context_for(language)
        else:
            chosen = self.get_context(context if isinstance(context, str) else context.id)
            if language is not None and normalise_language(language) != chosen.language:
                raise ConfigError(
                    f"context {chosen.id} runs {chosen.language}, not {language!r}; give "
                    "one of the two"
                )
        kernel = self._kernel_of(chosen.id)
        async with self._lock:  # one request at a time: outputs never interleave
            self.check_open()
            wall = time.time()
            execution = await kernel.run(code, timeout, on_output)
        await self._emit(
            PythonExecuted(
                self.id,
                code,
                execution,
                wall,
                current_context(),
                language=chosen.language,
                kernel=chosen.kernel,
                context_id=chosen.id,
            )
        )
        await self._emit_restarts(requested=False)
        await self._emit_refusals()
        return execution

    async def run_python(
        self,
        code: str,
        timeout: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> Execution:
        """:meth:`run_code` in python: the sandbox's own kernel when it is python's."""
        return await self.run_code(code, "python", timeout=timeout, on_output=on_output)

    # -- contexts ------------------------------------------------------------------

    @property
    def default_context(self) -> Context:
        """The sandbox's own kernel (``config.kernel``), as a context."""
        language, kernel = self._default_language, self.config.kernel
        return Context(DEFAULT_CONTEXT, language, kernel, self.working_dir)

    @property
    def _default_language(self) -> str:
        if self.config.kernel == IPYTHON_KERNEL:
            return "python"
        specs = self._kernelspecs or {}
        spec = specs.get(self.config.kernel)
        return spec.speaks if spec is not None else self.config.kernel

    async def kernelspecs(self) -> dict[str, KernelSpecInfo]:
        """The Jupyter kernels the sandbox's image holds, by kernelspec name (asked once,
        inside the sandbox: any image with a kernelspec works)."""
        self.check_open()
        if self._kernelspecs is None:
            result = await self.host.exec(
                [self.host.kernel_python, "-c", KERNELSPECS_SCRIPT],
                max_output_bytes=MAX_KERNELSPECS_BYTES,
                deadline=self.config.startup_timeout,
            )
            if result.exit_code != 0:
                detail = result.stderr.decode(errors="replace").strip()[-500:]
                raise KernelError(f"the image's kernelspecs could not be listed: {detail}")
            if result.truncated_bytes:  # a listing cut in its middle is not JSON anyway
                raise KernelError(
                    "the image lists more kernelspecs than kernel-sandbox reads (a listing of"
                    f" {format_size(MAX_KERNELSPECS_BYTES)} at most); remove some from the image"
                )
            self._kernelspecs = parse_kernelspecs(result.stdout.decode(errors="replace"))
        return self._kernelspecs

    def known_kernelspecs(self) -> dict[str, KernelSpecInfo] | None:
        """:meth:`kernelspecs` if the image was asked already (at the start of a sandbox
        whose kernel is not IPython's, or by a call since), else None: no call made."""
        return None if self._kernelspecs is None else dict(self._kernelspecs)

    def known_languages(self) -> list[str] | None:
        """:meth:`languages` if the image was asked already (tools describe themselves
        without a call into the sandbox), else None."""
        if self._kernelspecs is None:
            return None
        return sorted({spec.speaks for spec in self._kernelspecs.values()})

    async def languages(self) -> list[str]:
        """The languages the image has kernels for (``python``, ``r``, ...), sorted."""
        return sorted({spec.speaks for spec in (await self.kernelspecs()).values()})

    def kernel_info(self, context: Context | str | None = None) -> dict[str, Any]:
        """What a context's kernel (default: the sandbox's own) said of itself when it
        last started: the content of its ``kernel_info_reply`` (``language_info``,
        ``implementation``, ``banner``...), as the kernel sent it; notebooks record its
        ``language_info`` (:mod:`kernel_sandbox.notebook.languages` bounds it)."""
        if context is None:
            return dict(self._kernel.kernel_info)
        found = self.get_context(context if isinstance(context, str) else context.id)
        return dict(self._kernel_of(found.id).kernel_info)

    def list_contexts(self) -> list[Context]:
        """The sandbox's own kernel, then every context made since, in order."""
        return [self.default_context, *(c for c, _ in self._contexts.values())]

    def get_context(self, context_id: str) -> Context:
        """The context with id ``context_id``; raises ContextNotFoundError."""
        if context_id == DEFAULT_CONTEXT:
            return self.default_context
        found = self._contexts.get(context_id)
        if found is None:
            raise ContextNotFoundError(
                f"sandbox {self.id} has no context {context_id!r}; it has "
                + ", ".join(c.id for c in self.list_contexts())
            )
        return found[0]

    def _kernel_of(self, context_id: str) -> RunningKernel:
        return self._kernel if context_id == DEFAULT_CONTEXT else self._contexts[context_id][1]

    async def _context_for(self, language: str | None) -> Context:
        if language is None:
            return self.default_context
        wanted = normalise_language(language)
        if self.config.kernel == IPYTHON_KERNEL and wanted == "python":
            return self.default_context  # no need to ask the image
        kernel = kernel_for(wanted, await self.kernelspecs())
        for context in self.list_contexts():
            if context.kernel == kernel:
                return context
        return await self.create_context(language=wanted, kernel=kernel)

    async def create_context(
        self,
        language: str | None = None,
        *,
        kernel: str | None = None,
        cwd: str | None = None,
    ) -> Context:
        """Start another kernel in this sandbox: its own variables, the sandbox's files.

        ``kernel`` names a kernelspec of the image; else ``language`` picks one (see
        :meth:`kernelspecs`); with neither, the sandbox's own kernelspec.  ``cwd`` is
        where it starts (relative to the working directory).  At most
        :data:`~kernel_sandbox.limits.MAX_CONTEXTS` contexts beside the default.  Each
        kernel costs the sandbox its memory, within the same ``memory_limit``.
        """
        self.check_open()
        specs = await self.kernelspecs()
        if kernel is None:
            kernel = kernel_for(language, specs) if language else self.config.kernel
        elif kernel not in specs:
            raise ConfigError(
                f"the image has no kernelspec {kernel!r}; it has: {', '.join(sorted(specs))}"
            )
        spec = specs.get(kernel)
        speaks = spec.speaks if spec is not None else normalise_language(language or kernel)
        if language is not None and normalise_language(language) != speaks:
            speaks = normalise_language(language)  # e.g. javascript on Deno's typescript
        workdir = self.resolve_path(cwd or ".")
        async with self._lock:
            self.check_open()
            if len(self._contexts) >= MAX_CONTEXTS:
                raise ConfigError(
                    f"sandbox {self.id} has {MAX_CONTEXTS} contexts already (MAX_CONTEXTS); "
                    "remove one first"
                )
            context = Context(secrets.token_hex(6), speaks, kernel, workdir)
            host = await self.host.open_context(context.id, kernel, workdir)
            running = RunningKernel(host, self.config, self.id, kernel)
            try:
                await running.connect(await host.launch())
            except BaseException:
                running.close()
                await host.cleanup()
                raise
            self._contexts[context.id] = (context, running)
        await self._emit(ContextChanged(self.id, context, "created", current_context()))
        return context

    async def restart_context(self, context: Context | str) -> None:
        """Restart one context's kernel: its variables are lost, files and the other
        contexts are kept (the default context's restart is :meth:`restart`'s, which
        also ends every process of the sandbox)."""
        found = self.get_context(context if isinstance(context, str) else context.id)
        if found.is_default:
            await self.restart()
            return
        async with self._lock:
            kernel = self._kernel_of(found.id)
            try:
                await kernel.restart()
            finally:
                await self._emit_restarts(requested=True)

    async def remove_context(self, context: Context | str) -> None:
        """End a context's kernel and forget it; the default context cannot be removed."""
        found = self.get_context(context if isinstance(context, str) else context.id)
        if found.is_default:
            raise ConfigError("the default context is the sandbox's own kernel: close the sandbox")
        async with self._lock:
            _, kernel = self._contexts.pop(found.id)
            kernel.close()
            await kernel.host.cleanup()
        await self._emit(ContextChanged(self.id, found, "removed", current_context()))

    async def interrupt(self, context: Context | str | None = None) -> None:
        """Interrupt the cell running now in a context (default: the sandbox's kernel);
        variables stay.

        Not serialised with other calls (the cell holds the lock): it signals the
        kernel as jupyter_client does a kernel with ``interrupt_mode: signal`` (a kernel
        that wants messages gets one from the sandbox's relay).  An idle kernel ignores
        it.  Raises :class:`~kernel_sandbox.errors.KernelError` when no kernel runs.
        """
        self.check_open()
        if context is None:
            await self.host.interrupt()
            return
        found = self.get_context(context if isinstance(context, str) else context.id)
        await self._kernel_of(found.id).host.interrupt()

    async def restart(self) -> None:
        """Restart the kernel: every variable is lost, files in the sandbox are kept.

        Every process in the sandbox ends too, including what shell commands left
        running in the background, and so every other context's kernel: each is
        started afresh, with its id kept.
        """
        self.check_open()
        async with self._lock:
            try:
                await self._kernel.restart(kill_all=True)
                for _, kernel in self._contexts.values():
                    await kernel.restart()
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
        Exact (a sandbox made with ``exact_snapshots=True``, under gVisor): the whole
        sandbox by the runtime's checkpoint — every process and thread where it was,
        open files, variables whatever their type, the in-memory files; the kernel is
        unreachable for the checkpoint's moment.  ``exact=None`` takes an exact one
        where the sandbox is ready for it, else a portable one; ``exact=True`` raises
        :class:`~kernel_sandbox.errors.SnapshotError` where it cannot be had, saying
        why; ``exact=False`` is always portable.  The sandbox runs on, unchanged (its
        history and execution count too).
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
        if exact is None:
            exact = self.config.exact_snapshots
        if exact:
            why = await self.host.exact_refusal()
            if why is not None:
                raise SnapshotError(
                    f"sandbox {self.id} cannot take an exact snapshot: {why}; use "
                    "exact=None or exact=False for a portable one"
                )
        if self._kernel.session is None:
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
        if exact:
            return await self._checkpoint(store, base, max_bytes, keep_running=paused is None)
        return await take_snapshot(
            self.host,
            self._run_hidden,
            store,
            base,
            places=self.host.snapshot_places(tmp),
            max_bytes=max_bytes,
            max_entries=MAX_SNAPSHOT_FILES,
        )

    async def _checkpoint(
        self, store: SnapshotStore, base: dict[str, Any], max_bytes: int, *, keep_running: bool
    ) -> Snapshot:
        """An exact snapshot; the sandbox is started again from its checkpoint unless
        it is being paused (and then too if storing the checkpoint failed)."""
        started = time.monotonic()
        info = self._kernel.info
        self._kernel.close()
        try:
            files, connection = await self.host.checkpoint()
        except BaseException:
            assert info is not None  # the host runs on: connect to it again
            await self._kernel.connect(info)
            raise
        try:
            snap = await save_checkpoint(
                store, base, files, connection, max_bytes=max_bytes, started=started
            )
        except BaseException:
            await self._kernel.connect(await self.host.resume_checkpoint())
            raise
        if keep_running:
            await self._kernel.connect(await self.host.resume_checkpoint())
        return snap

    async def _run_hidden(self, code: str, timeout: float) -> str:
        """Run the machinery's code in the kernel (no history, no events); its stdout."""
        assert self._kernel.session is not None
        raw = await self._kernel.session.execute(
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
            if raw.outcome in ("interrupted", "stuck"):  # its time was up
                why = f"it ran past its {timeout:g}s ({raw.outcome})"
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
        saved = {k: v for k, v in snap.config.items() if k in SandboxConfig.model_fields}
        config = SandboxConfig(**saved).with_overrides(**overrides)
        if snap.exact:  # the container starts from the checkpoint: nothing to load
            connection = await load_connection(store, snap)
            sandbox = await cls._start(
                config,
                host,
                sandbox_id,
                prepare=lambda h: h.restore_checkpoint(connection, restore_into(store, snap)),
            )
            sandbox.restored = Restored(snapshot_id=snap.id)
            return sandbox
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
