"""AsyncSandbox: one container, one persistent IPython kernel, shell and files beside it.

The kernel runs under a tiny supervisor, the container's main process (behind Docker's
init), which restarts it in place so that files survive a kernel restart.  It is reached
with jupyter_client over unix sockets in a per-sandbox host directory that is
bind-mounted into the container, so the default sandbox has no network at all; the
sandbox cannot write to that directory while its kernel is connected (``statedir``).
Shell commands and file operations are processes the engine runs (exec) as the
sandbox user, so a busy or dead kernel never blocks them.  The root filesystem is
read-only: everything the sandbox writes lands in per-sandbox in-memory volumes
bounded by ``disk_limit``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import logging
import os
import posixpath
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from .backends.base import Backend, ContainerSpec, ContainerState
from .config import KERNEL_PYTHON, LABEL_PREFIX, SandboxConfig
from .egress import SandboxEgress
from .errors import (
    ContainerStoppedError,
    FileOperationError,
    KernelError,
    SandboxClosedError,
    SandboxError,
    SandboxStartError,
)
from .events import EgressRefused, Listener, PythonExecuted, ShellExecuted, emit
from .files import AsyncFiles
from .kernel.client import KernelSession, OutputCallback, RawExecution
from .kernel.connection import (
    CONTAINER_RUN_DIR,
    ConnectionInfo,
    free_tcp_ports,
    ipc_socket_names,
    launch_command,
    new_connection_info,
)
from .kernel.supervisor import KILL_ALL_SIGNAL, KILL_SIGNAL, TCP_STATE_DIR
from .results import CommandResult, Execution, ExecutionError, ExecutionStatus, strip_ansi
from .shell import run_command
from .statedir import ContainerStateDir, HostRunDir, StateDir
from .writable import create_writable_area

__all__ = ["AsyncSandbox", "runtime_root"]

log = logging.getLogger(__name__)

#: Seconds between engine checks of the container while the kernel's status is unknown
#: (the supervisor's status reports a dead kernel; the engine a dead container).
_ENGINE_POLL = 2.0
#: Seconds the supervisor gets to report the end of a kernel it was told to kill.
_KILL_LIMIT = 5.0


def runtime_root() -> Path:
    """The host directory that holds every sandbox's run directory, private to this user."""
    base = os.environ.get("KERNEL_SANDBOX_RUNTIME_DIR") or os.path.join(
        tempfile.gettempdir(), f"kernel-sandbox-{os.getuid()}"
    )
    root = Path(base)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    return root


# Sandboxes not closed yet: removed at interpreter exit if their owner forgot to.
_unclosed: dict[str, AsyncSandbox] = {}


@atexit.register
def _remove_unclosed() -> None:
    # No event loop or thread pool can be relied on at exit: remove synchronously.
    for sandbox in list(_unclosed.values()):
        try:
            if sandbox.container_id is not None:
                sandbox.backend.remove_blocking(sandbox.container_id)
            sandbox.backend.remove_volumes_blocking(sandbox._volumes)
            remove_network = getattr(sandbox.backend, "remove_network_blocking", None)
            if sandbox._network is not None and remove_network is not None:
                remove_network(sandbox._network)
        except Exception:  # exit must go on; `kernel-sandbox gc` finds what is left
            log.warning("could not remove sandbox %s at exit", sandbox.id, exc_info=True)
        if sandbox._state is not None:
            sandbox._state.close()
        if sandbox._egress is not None:  # the proxy ends with this process
            shutil.rmtree(sandbox._egress.host_dir, ignore_errors=True)


def _default_backend() -> Backend:
    from .backends.docker import DockerBackend

    return DockerBackend()


class AsyncSandbox:
    """A stateful Python sandbox in a container.

    Create one with :meth:`create` (or ``async with await AsyncSandbox.create()``);
    :meth:`close` removes the container and every host-side file it used.
    """

    def __init__(self, config: SandboxConfig, backend: Backend, sandbox_id: str) -> None:
        self.config = config
        self.id = sandbox_id
        self.backend = backend
        self.container_id: str | None = None
        self.image = config.image
        self.files = AsyncFiles(self)
        self._run_dir: Path | None = None
        #: The supervisor's state directory: its reports of kernel ends, its go-aheads.
        self._state: StateDir | None = None
        #: Names of the volumes that hold the writable area (removed on close).
        self._volumes: list[str] = []
        self._host_info: ConnectionInfo | None = None
        #: The host-side proxy and its directory, under network='packages' or a list.
        self._egress: SandboxEgress | None = None
        self._session: KernelSession | None = None
        self._engine_checked = 0.0
        self._lock = asyncio.Lock()
        self._closed = False
        #: Why calls are refused before :meth:`close` ran (released to a pool).
        self._retired = ""
        self.created_at = time.time()
        #: Called with every :mod:`~kernel_sandbox.events` event of this sandbox.
        self.listeners: list[Listener] = []

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        config: SandboxConfig | None = None,
        *,
        backend: Backend | None = None,
        **overrides: Any,
    ) -> AsyncSandbox:
        """Start a container with a ready kernel; ``overrides`` change single settings."""
        config = (config or SandboxConfig()).with_overrides(**overrides)
        sandbox = cls(config, backend or _default_backend(), secrets.token_hex(6))
        try:
            await sandbox._start()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    @property
    def labels(self) -> dict[str, str]:
        """Labels put on the container, so orphans can always be found and removed."""
        return {
            LABEL_PREFIX: "true",
            f"{LABEL_PREFIX}.id": self.id,
            f"{LABEL_PREFIX}.owner-pid": str(os.getpid()),
            f"{LABEL_PREFIX}.owner-host": socket.gethostname(),
            f"{LABEL_PREFIX}.run-dir": str(self._run_dir or ""),
            **self.config.labels,
        }

    async def _start(self) -> None:
        from .images import resolve_kernel_image

        cfg = self.config
        self.image = await resolve_kernel_image(cfg.image, derive=cfg.derive_image)
        volumes = dict(cfg.volumes)
        published: dict[int, int] = {}
        if cfg.transport == "ipc":
            self._run_dir = runtime_root() / self.id
            container_info = new_connection_info("ipc", f"{CONTAINER_RUN_DIR}/k")
            self._state = HostRunDir(self._run_dir, ipc_socket_names(container_info))
            volumes[str(self._run_dir)] = {"bind": CONTAINER_RUN_DIR, "mode": "rw"}
            host_info = dict(container_info, ip=str(self._run_dir / "k"))
        else:
            ports = free_tcp_ports()
            container_info = new_connection_info("tcp", "0.0.0.0", ports)
            host_info = dict(container_info, ip="127.0.0.1")
            if cfg.network_enabled:
                published = {p: p for p in ports}
        _unclosed[self.id] = self  # from here on there may be volumes to remove
        volumes.update(  # after the run dir is known: the volumes get the container's labels
            await create_writable_area(
                self.backend,
                cfg,
                self.image,
                prefix=f"kernel-sandbox-{self.id}",
                labels=self.labels,
                created=self._volumes,
            )
        )
        command, env = launch_command(KERNEL_PYTHON, container_info, self._state_dir)
        if cfg.egress:
            self._egress = SandboxEgress(
                cfg.network, runtime_root() / f"{self.id}.egress", cfg.ca_bundle, name=self.id
            )
            await self._egress.start()
            volumes.update(self._egress.mount())
            env.update(self._egress.environment())
            command = self._egress.wrap_command(command, KERNEL_PYTHON)
        spec = ContainerSpec(
            image=self.image,
            command=command,
            user=cfg.user,
            working_dir=cfg.working_dir,
            environment={**cfg.env_vars, **env},
            volumes=volumes,
            labels=self.labels,
            memory_limit=cfg.memory_limit,
            cpu_limit=cfg.cpu_limit,
            pids_limit=cfg.pids_limit,
            network_enabled=cfg.network_enabled,
            name=f"kernel-sandbox-{self.id}",
            published_ports=published,
            own_network=self._network,
            read_only=cfg.disk_limit is not None,
            shm_size=cfg.disk_budget().get("shm"),
            runtime=cfg.runtime,
        )
        # The engine call goes on in its thread even if we are cancelled: wait for it, so
        # that close() knows the container and removes it instead of leaking it.
        starting = asyncio.ensure_future(self.backend.start(spec))
        try:
            self.container_id = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.container_id = await starting
            raise
        finally:
            if self.container_id is not None:
                _unclosed[self.id] = self
        if cfg.transport == "tcp":
            self._state = ContainerStateDir(self.backend, self.container_id, cfg.user)
            if not cfg.network_enabled:
                host_info["ip"] = await self.backend.address(self.container_id)
        self._host_info = host_info  # type: ignore[assignment]
        await self._connect()

    async def _connect(self) -> None:
        """Connect to the kernel that starts now, then seal the run directory again."""
        assert self._host_info is not None and self._state is not None
        session = KernelSession(self._host_info, self.config.max_output_bytes)
        try:
            await session.connect(self.config.startup_timeout, self._check_alive)
        except KernelError as exc:
            session.close()
            self._state.seal()  # a kernel that never came must not leave the directory open
            logs = await self._logs_tail()
            raise SandboxStartError(
                f"the kernel in image {self.image!r} did not start: {exc}{logs}"
            ) from exc
        except BaseException:  # cancelled: an unclosed client hangs zmq when collected
            session.close()
            self._state.seal()
            raise
        self._session = session
        self._state.seal()
        if self._egress is not None:
            await self._start_relay()

    async def _start_relay(self) -> None:
        """Start the egress relay inside (again, after a restart that ended it)."""
        assert self.container_id is not None and self._egress is not None
        try:
            result = await self.backend.exec(
                self.container_id,
                self._egress.relay_command(KERNEL_PYTHON),
                user=self.config.user,
                max_output_bytes=4096,
                deadline=self.config.startup_timeout,
            )
        except SandboxError as exc:
            raise KernelError(f"the egress relay did not start in the sandbox: {exc}") from exc
        if result.exit_code != 0:
            raise KernelError(
                f"the egress relay did not start in the sandbox (exit {result.exit_code}): "
                + result.stderr.decode(errors="replace")[-500:]
            )

    async def _logs_tail(self) -> str:
        if self.container_id is None:
            return ""
        try:
            text = (await self.backend.logs(self.container_id, tail=15)).strip()
        except Exception:  # the start error is what matters; the log is a bonus
            return ""
        return f"\ncontainer log (last lines):\n{text}" if text else ""

    @property
    def _network(self) -> str | None:
        """The tcp sandbox's own network (no other sandbox on it); None with ipc."""
        return f"kernel-sandbox-{self.id}" if self.config.transport == "tcp" else None

    @property
    def _state_dir(self) -> str:
        """The supervisor's state directory inside the container."""
        return CONTAINER_RUN_DIR if self.config.transport == "ipc" else TCP_STATE_DIR

    async def _check_alive(self) -> str | None:
        """None while the kernel lives, else a sentence saying why it died.

        The supervisor's status tells of a dead kernel (a local read with ``ipc``);
        the engine, asked at most every ``_ENGINE_POLL`` seconds, of a dead container.
        """
        if self.container_id is None or self._state is None:
            return "the container was not created"
        end = await self._state.kernel_end()
        if end is not None:
            return ContainerState(False, end.exit_code, end.oom_killed).death_reason()
        if time.monotonic() - self._engine_checked < _ENGINE_POLL:
            return None
        self._engine_checked = time.monotonic()
        state = await self.backend.state(self.container_id)
        return None if state.running else state.death_reason()

    async def close(self) -> None:
        """Remove the container, its volumes and the host-side run directory.  Safe twice."""
        if self._closed:
            return
        self._closed = True
        _unclosed.pop(self.id, None)
        if self._session is not None:
            self._session.close()
            self._session = None
        try:
            if self.container_id is not None:
                await self.backend.remove(self.container_id)
            await self.backend.remove_volumes(self._volumes)  # in use until the container goes
            if self._network is not None:
                await self.backend.remove_network(self._network)
        finally:
            if self._state is not None:
                self._state.close()
            if self._egress is not None:
                await self._egress.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._retired:
            raise SandboxClosedError(f"sandbox {self.id} {self._retired}")
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one")

    def _retire(self, why: str) -> None:
        """Refuse every later call at once, with ``why``, while :meth:`close` is still to
        come (a pool closes released sandboxes in the background)."""
        self._retired = why

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
        self._check_open()
        timeout = timeout or self.config.timeout
        async with self._lock:  # one request at a time: outputs never interleave
            self._check_open()
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
                    check_alive=self._check_alive,
                    on_output=on_output,
                    max_output_bytes=self.config.max_output_bytes,
                )
                execution = await self._judge(raw, timeout, started)
                if restarted and not execution.state_lost:
                    execution = dataclasses.replace(
                        execution,
                        state_lost=True,
                        message=f"the kernel had stopped before this call: {restarted}",
                    )
                if raw.truncated_bytes:
                    execution = dataclasses.replace(execution, truncated_bytes=raw.truncated_bytes)
                if raw.display_ids or raw.display_updates:
                    execution = dataclasses.replace(
                        execution, display_ids=raw.display_ids, display_updates=raw.display_updates
                    )
        if self.listeners:
            await emit(self.listeners, PythonExecuted(self.id, code, execution, wall))
        await self._report_refusals()
        return execution

    async def _report_refusals(self) -> None:
        """Tell listeners (the notebook) what the egress proxy refused during the call."""
        if self._egress is None:
            return
        refused = self._egress.take_refusals()
        if refused and self.listeners:
            await emit(
                self.listeners, EgressRefused(self.id, tuple(refused), str(self.config.network))
            )

    async def _judge(self, raw: RawExecution, timeout: float, started: float) -> Execution:
        error = _error_of(raw.outputs)
        count = raw.reply.get("execution_count")
        if raw.outcome == "finished":
            status: ExecutionStatus = (
                "error" if error or raw.reply.get("status") == "error" else "ok"
            )
            if status == "error" and error is None:  # reply-only error (e.g. aborted)
                c = raw.reply
                error = ExecutionError(c.get("ename", "Error"), c.get("evalue", ""), [])
            return Execution(status, raw.outputs, count, error, time.monotonic() - started)
        if raw.outcome == "interrupted":
            message = (
                f"execution timed out after {timeout:g}s and was interrupted; "
                "the kernel and its variables are kept"
            )
            return Execution(
                "timeout", raw.outputs, count, error, time.monotonic() - started, message=message
            )
        if raw.outcome == "stuck":
            why = f"execution timed out after {timeout:g}s and did not stop when interrupted"
            status = "timeout"
        else:
            why = raw.death_reason
            status = "kernel_died"
        message = f"{why}; {await self._try_restart()}"
        return Execution(
            status,  # type: ignore[arg-type]
            raw.outputs,
            count,
            error,
            time.monotonic() - started,
            state_lost=True,
            message=message,
        )

    async def _try_restart(self) -> str:
        """Restart the kernel; return a sentence saying what was lost, or why it failed."""
        try:
            return await self._restart_kernel()
        except SandboxError as exc:
            return f"restarting the kernel failed: {exc}"

    async def _restart_kernel(self, kill_all: bool = False) -> str:
        """Restart the kernel in place, else the whole container; say what was lost.

        ``kill_all`` ends every process of the sandbox, not only the kernel's.  The
        container restart is the fallback for a container that stopped (its supervisor
        was killed) or a supervisor that cannot start a new kernel in time.
        """
        if self._session is not None:
            self._session.close()
            self._session = None
        assert self.container_id is not None
        try:
            await self._restart_in_place(KILL_ALL_SIGNAL if kill_all else KILL_SIGNAL)
            return "the kernel was restarted and all variables were lost"
        except SandboxError as exc:
            # A stopped container (e.g. gVisor's whole-sandbox OOM kill) needs no more words
            stopped = isinstance(exc.__cause__, ContainerStoppedError)
            why = "its container had stopped" if stopped else str(exc)
        log.warning("sandbox %s: restarting the container: %s", self.id, why)
        assert self._state is not None
        try:
            # opened only once the old container is dead: nothing of it can plant there
            await self.backend.restart(self.container_id, before_start=self._state.open_for_kernel)
        except Exception as exc:
            raise KernelError(
                f"the kernel could not be restarted in place ({why}), "
                f"nor could the container: {exc}"
            ) from exc
        self._state.container_restarted()
        await self._connect()
        return (
            f"the kernel could not be restarted in place ({why}), so the whole container "
            "was restarted: all variables were lost, and files written in the sandbox may "
            "be lost too"
        )

    async def _restart_in_place(self, kill_signal: str) -> None:
        """Have the supervisor kill the kernel (see ``kill_signal``), then start a new one.

        Signalling a stopped container fails: the caller restarts the container then.
        """
        assert self.container_id is not None and self._state is not None
        await self.backend.signal(self.container_id, kill_signal)
        deadline = time.monotonic() + _KILL_LIMIT
        while await self._state.kernel_end() is None:
            if time.monotonic() > deadline:
                raise KernelError(
                    f"the supervisor did not report the kernel's end within {_KILL_LIMIT:g}s"
                )
            await asyncio.sleep(0.02)
        await self._state.start_next()
        await self._connect()

    async def restart(self) -> None:
        """Restart the kernel: every variable is lost, files in the sandbox are kept.

        Every process in the sandbox ends too, including what shell commands left
        running in the background.
        """
        self._check_open()
        async with self._lock:
            await self._restart_kernel(kill_all=True)

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
        self._check_open()
        assert self.container_id is not None
        wall = time.time()
        outcome = await run_command(
            self.backend,
            self.container_id,
            command,
            timeout=timeout or self.config.timeout,
            user=self.config.user,
            workdir=self.resolve_path(cwd or "."),
            env=env,
            max_output_bytes=self.config.max_output_bytes,
        )
        if self.listeners:
            await emit(self.listeners, ShellExecuted(self.id, command, outcome, wall, cwd))
        await self._report_refusals()
        return outcome

    def resolve_path(self, path: str) -> str:
        """An absolute path in the sandbox; relative paths start at the working directory.

        A NUL byte can be in no path; refused here, it would otherwise reach the engine,
        whose error names the host's storage directories.
        """
        if "\0" in path:
            raise FileOperationError(f"a path cannot contain a NUL byte: {path!r}")
        return posixpath.normpath(posixpath.join(self.config.working_dir, path))

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<AsyncSandbox {self.id} image={self.image!r} {state}>"


def _error_of(outputs: list[dict[str, Any]]) -> ExecutionError | None:
    for out in reversed(outputs):
        if out["output_type"] == "error":
            tb = [strip_ansi(line) for line in out.get("traceback", [])]
            return ExecutionError(out["ename"], out["evalue"], tb)
    return None
