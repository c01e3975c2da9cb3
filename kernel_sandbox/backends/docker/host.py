"""DockerHost: one sandbox as one container whose main process supervises the kernel.

The kernel runs under a tiny supervisor (``programs/supervisor.sh``, behind Docker's
init), which restarts it in place so that files survive a kernel restart.  With the
``ipc`` transport it is reached over unix sockets in a per-sandbox host directory that
is bind-mounted into the container, so the default sandbox has no network at all; the
sandbox cannot write to that directory while its kernel is connected (``statedir``).
Processes and files beside the kernel are processes the engine runs (exec) as the
sandbox user.  The
root filesystem is read-only: everything the sandbox writes lands in per-sandbox
in-memory volumes bounded by ``disk_limit`` (``writable``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import shutil
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker

from ...config import KERNEL_PYTHON, LABEL_PREFIX
from ...errors import ConfigError, KernelError, SandboxError, SnapshotError
from ...kernel.connection import (
    CONTAINER_RUN_DIR,
    ConnectionInfo,
    free_tcp_ports,
    ipc_socket_names,
    launch_command,
    new_connection_info,
)
from ...kernel.supervisor import (
    KILL_ALL_SIGNAL,
    KILL_SIGNAL,
    TCP_STATE_DIR,
    wait_for_kernel_end,
)
from ...limits import parse_size
from ...network import Decision
from ...rundirs import runtime_root
from ..base import ExecResult, HostState, KernelHost, Leftover, SandboxRecord
from . import checkpoints
from .contexts import DockerContextHost
from .egress import SandboxEgress
from .engine import ContainerSpec, DockerEngine, run_in_thread
from .exec import exec_process
from .gc import find_leftovers, remove_labelled
from .images import Confinement, resolve_kernel_image
from .statedir import ContainerStateDir, GuestStateDir, HostRunDir, StateDir
from .writable import create_writable_area, memory_writable_area

if TYPE_CHECKING:
    from ...config import SandboxConfig

__all__ = ["DockerHost"]

log = logging.getLogger(__name__)

#: Seconds between engine checks of the container while the kernel's status is unknown
#: (the supervisor's status reports a dead kernel; the engine a dead container).
_ENGINE_POLL = 2.0

# $1 is the signal number.  Fields after "comm)" in /proc/<pid>/stat: state ppid pgrp
# session.  The kernel leads its own session (the supervisor starts it with setsid) and
# its parent, the supervisor, is the child of PID 1 (Docker's init).  Found by a scan of
# /proc, since gVisor has no /proc/<pid>/task/<pid>/children.
_SIGNAL_KERNEL = (
    "for d in /proc/[0-9]*; do k=${d#/proc/}; "
    's=$(cat "$d/stat" 2>/dev/null) || continue; set -- "$1" ${s##*) }; '
    '[ "$5" = "$k" ] || continue; '
    'p=$(cat "/proc/$3/stat" 2>/dev/null) || continue; set -- "$1" ${p##*) }; '
    '[ "$3" = 1 ] && { kill -"$1" "$k"; exit; }; '
    "done; exit 3"
)

# Hosts not cleaned up yet: removed at interpreter exit if their sandbox was never closed.
_unclosed: dict[str, DockerHost] = {}


@atexit.register
def _remove_unclosed() -> None:
    # No event loop or thread pool can be relied on at exit: remove synchronously.
    for host in list(_unclosed.values()):
        try:
            host.remove_blocking()
        except Exception:  # exit must go on; `kernel-sandbox gc` finds what is left
            log.warning("could not remove sandbox %s at exit", host.sandbox_id, exc_info=True)


class DockerHost(KernelHost):
    """Runs a sandbox's kernel in a container on a local or remote Docker engine.

    ``client`` is the docker SDK client to use (default: one per process, checked with
    a ping); pass ``functools.partial(DockerHost, client=...)`` as ``host=``.
    """

    name = "docker"

    def __init__(
        self, sandbox_id: str, config: SandboxConfig, *, client: docker.DockerClient | None = None
    ) -> None:
        super().__init__(sandbox_id, config)
        self.engine = DockerEngine(client)
        self._run_dir: Path | None = None
        #: The supervisor's state directory: its reports of kernel ends, its go-aheads.
        self._state: StateDir | None = None
        #: Names of the volumes that hold the writable area (removed by cleanup).
        self._volumes: list[str] = []
        self._info: ConnectionInfo | None = None
        self._engine_checked = 0.0
        #: False for a guest (``attach(own=False)``): nothing is removed or restarted.
        self._own = True
        #: The host-side proxy and its directory, under network='packages' or a list.
        self.egress: SandboxEgress | None = None
        #: The kernel's connection as the container sees it (its sockets' paths).
        self._container_info: ConnectionInfo | None = None
        #: Set by :meth:`restore_checkpoint`: launch starts from that checkpoint.
        self._restore: tuple[ConnectionInfo, Callable[[Path], Awaitable[None]]] | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The owner labels plus the run directory, which gc removes with the container
        (and, for a sandbox ready for exact snapshots, that it is: an adopter needs it)."""
        labels = {**super().labels, f"{LABEL_PREFIX}.run-dir": str(self._run_dir or "")}
        if self.config.exact_snapshots:
            labels[f"{LABEL_PREFIX}.exact"] = "1"
        return labels

    @property
    def protected_paths(self) -> tuple[str, ...]:
        """The run directory: the kernel's connection (on the host with ``ipc``)."""
        return (CONTAINER_RUN_DIR,)

    @property
    def network(self) -> str | None:
        """The tcp sandbox's own network (no other sandbox on it); None with ipc."""
        return f"kernel-sandbox-{self.sandbox_id}" if self.config.transport == "tcp" else None

    @property
    def run_dir(self) -> Path | None:
        """The ``ipc`` run directory on this host (None with ``tcp``)."""
        return self._run_dir

    async def open_context(self, context_id: str, kernel: str, cwd: str) -> KernelHost:
        """Another kernel in this container, under a supervisor of its own (``ipc``)."""
        self._check_own("start a context in it")
        if self.config.exact_snapshots:
            raise ConfigError(
                "a sandbox ready for exact snapshots runs one kernel: contexts are not "
                "available in it (its checkpoint carries only the bridged main kernel)"
            )
        return DockerContextHost(self, context_id, kernel, cwd)

    def keep_entry(self, name: str) -> None:
        """Keep ``name`` (a context's directory) when the run directory is sealed."""
        if isinstance(self._state, HostRunDir):
            self._state.keep.add(name)

    def release_entry(self, name: str) -> None:
        """Stop keeping ``name``: the next seal removes whatever is left of it."""
        if isinstance(self._state, HostRunDir):
            self._state.keep.discard(name)

    @property
    def container_id(self) -> str | None:
        """The container's id once it was created (the same as ``resource_id``)."""
        return self.resource_id

    # -- lifecycle ---------------------------------------------------------------------

    async def launch(self) -> ConnectionInfo:
        if self._info is not None:
            raise KernelError(f"sandbox {self.sandbox_id} was launched already")
        cfg = self.config
        self.image = await resolve_kernel_image(
            cfg.image,
            derive=cfg.derive_image,
            pull=cfg.pull_image,
            client=self.engine.client,
            limits=Confinement.of(
                cfg.runtime, parse_size(cfg.memory_limit), cfg.pids_limit, cfg.cpu_limit
            ),
        )
        engine_info = await self._check_exact() if cfg.exact_snapshots else {}
        volumes = dict(cfg.volumes)
        published: dict[int, int] = {}
        if cfg.transport == "ipc":
            self._run_dir = runtime_root() / self.sandbox_id
            container_info = (
                self._restore[0]
                if self._restore is not None
                else new_connection_info("ipc", f"{CONTAINER_RUN_DIR}/k")
            )
            self._state = HostRunDir(self._run_dir, ipc_socket_names(container_info))
            volumes[str(self._run_dir)] = {"bind": CONTAINER_RUN_DIR, "mode": "rw"}
            host_info = dict(container_info, ip=str(self._run_dir / "k"))
        else:
            ports = free_tcp_ports()
            container_info = new_connection_info("tcp", "0.0.0.0", ports)
            host_info = dict(container_info, ip="127.0.0.1")
            if cfg.network_enabled:
                published = {p: p for p in ports}
        self._container_info = container_info
        _unclosed[self.sandbox_id] = self  # from here on there may be something to remove
        tmpfs: dict[str, str] = {}
        if cfg.exact_snapshots:  # in the sandbox's memory, which a checkpoint carries
            tmpfs = await memory_writable_area(self.engine, cfg, self.image)
        else:  # after the run dir is known: the volumes get the container's labels
            volumes.update(
                await create_writable_area(
                    self.engine,
                    cfg,
                    self.image,
                    prefix=f"kernel-sandbox-{self.sandbox_id}",
                    labels=self.labels,
                    created=self._volumes,
                )
            )
        state_dir = CONTAINER_RUN_DIR if cfg.transport == "ipc" else TCP_STATE_DIR
        command, env = launch_command(KERNEL_PYTHON, container_info, state_dir, cfg.kernel)
        if cfg.exact_snapshots:
            env["KERNEL_SANDBOX_BRIDGED"] = "1"
        if cfg.egress:
            self.egress = SandboxEgress(
                cfg.network,
                runtime_root() / f"{self.sandbox_id}.egress",
                cfg.ca_bundle,
                name=self.sandbox_id,
            )
            await self.egress.start()
            volumes.update(self.egress.mount())
            env.update(self.egress.environment())
            command = self.egress.wrap_command(command, KERNEL_PYTHON)
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
            name=f"kernel-sandbox-{self.sandbox_id}",
            published_ports=published,
            own_network=self.network,
            read_only=cfg.disk_limit is not None or cfg.exact_snapshots,
            shm_size=cfg.disk_budget().get("shm"),
            runtime=cfg.runtime,
            tmpfs=tmpfs,
        )
        # The engine call goes on in its thread even if we are cancelled: wait for it, so
        # that cleanup() knows the container and removes it instead of leaking it.
        restoring = self._restore is not None
        starting = asyncio.ensure_future(
            self.engine.create(spec) if restoring else self.engine.start(spec)
        )
        try:
            self.resource_id = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.resource_id = await starting
            raise
        # The engine has just started it: the first check of the container while its
        # kernel starts comes _ENGINE_POLL from now (a dead kernel is told by the
        # supervisor meanwhile), not at once; a start that answers sooner makes none
        # (an inspect per create, one engine call of six).
        self._engine_checked = time.monotonic()
        if self._restore is not None:
            await self._restore[1](checkpoints.checkpoint_dir(engine_info, self.resource_id))
            await checkpoints.start_from_checkpoint(self.engine.api, self.resource_id)
            await checkpoints.delete_checkpoint(self.engine.api, engine_info, self.resource_id)
            self._restore = None
        if cfg.transport == "tcp":
            self._state = ContainerStateDir(self.engine.api, self.resource_id, cfg.user)
            if not cfg.network_enabled:
                host_info["ip"] = await self.engine.address(self.resource_id)
        await self._start_relay()
        self._info = host_info  # type: ignore[assignment]
        return self._info  # type: ignore[return-value]

    async def attach(self, record: SandboxRecord, *, own: bool = True) -> ConnectionInfo:
        """Reconnect to a running container's kernel, from what only the host can read.

        The connection info (with its HMAC key and CURVE keys) is the container's
        ``KERNEL_SANDBOX_CONNECTION`` environment, read through the engine's API (the
        labels carry no key); the ``ipc`` run directory is named by its label and must
        be one of this user's.  The settings the container was made with (transport,
        user, working directory, network) replace this host's config.  An owner takes
        over the run directory's claim (``tcp``: claims a directory of its own there, as
        Docker cannot relabel the container; gc keeps what is claimed) and the
        supervisor's reports; a guest touches neither.  The supervisor numbers kernels
        from 1 per container; an adopted one may be further on, so a later in-place
        restart may fall back to a container restart (files are kept either way).
        """
        if self._info is not None:
            raise KernelError(f"sandbox {self.sandbox_id} was launched already")
        if not record.running:
            raise KernelError(f"sandbox {self.sandbox_id}'s container is {record.state}")
        inspected = await self.engine.inspect(record.resource_id)
        env = dict(
            item.split("=", 1) for item in inspected["Config"].get("Env") or [] if "=" in item
        )
        try:
            container_info = json.loads(env["KERNEL_SANDBOX_CONNECTION"])
            transport = container_info["transport"]
        except (KeyError, ValueError, TypeError) as exc:
            raise KernelError(
                f"container {record.name} carries no kernel connection; not a sandbox?"
            ) from exc
        # ipc: "bridge" or "none"; tcp: its own network, with the kernel's ports
        # published on 127.0.0.1 when it may reach out (see launch)
        published = bool(inspected["HostConfig"].get("PortBindings"))
        network_mode = str(inspected["HostConfig"].get("NetworkMode") or "")
        enabled = published if transport == "tcp" else network_mode not in ("none", "")
        self.config = self.config.model_copy(
            update={
                "transport": transport,
                "user": inspected["Config"].get("User") or self.config.user,
                "working_dir": inspected["Config"].get("WorkingDir") or self.config.working_dir,
                "network_enabled": enabled,
                "image": record.image,
                "exact_snapshots": record.labels.get(f"{LABEL_PREFIX}.exact") == "1",
            }
        )
        self.image, self.resource_id, self._own = record.image, record.resource_id, own
        self._container_info = container_info
        if transport == "ipc":
            run_dir = Path(record.labels.get(f"{LABEL_PREFIX}.run-dir") or "/nonexistent")
            host_info = dict(container_info, ip=str(run_dir / "k"))
            if own:
                self._state = HostRunDir.adopt(run_dir, ipc_socket_names(container_info))
            else:
                self._state = GuestStateDir()
            self._run_dir = run_dir
        else:
            ip = "127.0.0.1" if self.config.network_enabled else None
            host_info = dict(container_info, ip=ip or await self.engine.address(record.resource_id))
            self._state = (
                ContainerStateDir.adopt(
                    self.engine.api, record.resource_id, self.config.user, self.sandbox_id
                )
                if own
                else GuestStateDir()
            )
        if own:
            volumes = await self.engine.list_volumes({f"{LABEL_PREFIX}.id": self.sandbox_id})
            self._volumes = [str(v["name"]) for v in volumes]
            _unclosed[self.sandbox_id] = self
        self._info = host_info  # type: ignore[assignment]
        return self._info  # type: ignore[return-value]

    async def post_launch(self) -> None:
        """The connect attempt is over: seal the run directory again (also after a
        kernel that never came: it must not leave the directory open)."""
        if self._state is not None and self._own:
            self._state.seal()

    async def poll(self) -> str | None:
        """The supervisor's status tells of a dead kernel (a local read with ``ipc``);
        the engine, asked at most every ``_ENGINE_POLL`` seconds, of a dead container."""
        if self.resource_id is None or self._state is None:
            return "the container was not created"
        end = await self._state.kernel_end()
        if end is not None:
            return HostState(False, end.exit_code, end.oom_killed).death_reason()
        if time.monotonic() - self._engine_checked < _ENGINE_POLL:
            return None
        self._engine_checked = time.monotonic()
        state = await self.engine.state(self.resource_id)
        return None if state.running else state.death_reason()

    async def state(self) -> HostState:
        if self.resource_id is None:
            return HostState(False, error="the container was not created")
        return await self.engine.state(self.resource_id)

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel process, as the sandbox user (``kill`` run beside it).

        The kernel is the supervisor's child that leads its own session; the
        supervisor is the only child of the container's init.
        """
        result = await self.exec(
            ["sh", "-c", _SIGNAL_KERNEL, "sh", str(int(signum))], max_output_bytes=4096
        )
        if result.exit_code != 0:
            raise KernelError(
                f"could not signal the kernel: "
                f"{result.stderr.decode(errors='replace').strip() or 'no kernel is running'}"
            )

    async def restart_kernel(self, *, kill_all: bool = False) -> ConnectionInfo:
        """Have the supervisor kill the kernel (its group, or everything with ``kill_all``),
        wait for the report of its end, then let it start the next one.

        Signalling a stopped container fails: the caller restarts the container then.
        """
        self._check_own("restart its kernel")
        container, state = self._container(), self._state
        assert state is not None and self._info is not None
        await self.engine.signal(container, KILL_ALL_SIGNAL if kill_all else KILL_SIGNAL)
        await wait_for_kernel_end(state.kernel_end, poll=0.02)
        await state.start_next()
        await self._start_relay()  # everything ended with kill_all: the relay too
        return self._info

    async def restart_whole(self) -> ConnectionInfo:
        """Restart the same container (its volumes, and so its files, are kept)."""
        self._check_own("restart its container")
        container, state = self._container(), self._state
        assert state is not None and self._info is not None
        # opened only once the old container is dead: nothing of it can plant there
        await self.engine.restart(container, before_start=state.open_for_kernel)
        state.container_restarted()
        await self._start_relay()
        return self._info

    async def _start_relay(self) -> None:
        if self.config.exact_snapshots:
            await self._start_bridge()
        if self.egress is not None:
            await self.egress.start_relay(self, KERNEL_PYTHON, self.config.startup_timeout)

    # -- exact snapshots: the whole sandbox by gVisor's checkpoint ------------------------

    async def exact_refusal(self) -> str | None:
        """Why this sandbox cannot be checkpointed; None if it can."""
        why, _ = await self._exact_support()
        return why

    async def _exact_support(self) -> tuple[str | None, dict[str, Any]]:
        if not self.config.exact_snapshots:
            return (
                "the sandbox was not made ready for exact snapshots "
                "(SandboxConfig(exact_snapshots=True))",
                {},
            )
        info: dict[str, Any] = await run_in_thread(self.engine.api.info)
        name = self.config.runtime or str(info.get("DefaultRuntime") or "runc")
        runtime = (await self.engine.runtimes()).get(name)
        if runtime is None or not runtime.gvisor:
            return f"exact snapshots need gVisor (runtime='runsc'), not {name!r}", info
        return checkpoints.checkpoint_support(info), info

    async def _check_exact(self) -> dict[str, Any]:
        why, info = await self._exact_support()
        if why is not None:
            raise ConfigError(f"exact_snapshots=True cannot be had here: {why}")
        return info

    async def checkpoint(self) -> tuple[list[tuple[str, Path]], ConnectionInfo]:
        """Checkpoint the container (it stops, its memory is in the checkpoint): the
        checkpoint's files and the kernel's connection as the container sees it.

        The kernel's bridge is stopped first: nothing in the sandbox may hold a socket
        the host backs.  :meth:`resume_checkpoint` starts the same container again."""
        self._check_own("checkpoint it")
        why, info = await self._exact_support()
        if why is not None:
            raise SnapshotError(f"sandbox {self.sandbox_id} cannot take an exact snapshot: {why}")
        container = self._container()
        assert self._container_info is not None
        await self._exec_checked(checkpoints.stop_bridge_command(), "stop the kernel's bridge")
        try:
            await checkpoints.create_checkpoint(self.engine.api, container)
        except SnapshotError:
            await self._start_bridge()  # it runs on, as before
            raise
        where = checkpoints.checkpoint_dir(info, container)
        files = await run_in_thread(lambda: sorted((p.name, p) for p in where.iterdir()))
        return files, self._container_info

    async def resume_checkpoint(self) -> ConnectionInfo:
        """Start the checkpointed container again from its checkpoint (then removed)."""
        container = self._container()
        info: dict[str, Any] = await run_in_thread(self.engine.api.info)
        await checkpoints.start_from_checkpoint(self.engine.api, container)
        await checkpoints.delete_checkpoint(self.engine.api, info, container)
        await self._start_bridge()
        assert self._info is not None
        return self._info

    def restore_checkpoint(
        self, info: ConnectionInfo, fill: Callable[[Path], Awaitable[None]]
    ) -> None:
        """Have :meth:`launch` start from a checkpoint: ``fill`` writes its files into
        the (new) container's checkpoint directory; ``info`` is the kernel's connection
        saved with it (the restored kernel has its key and socket names)."""
        self._restore = (info, fill)

    async def _start_bridge(self) -> None:
        """(Again) the kernel's bridge, on a run directory opened for its sockets; the
        connect that follows seals it (``post_launch``)."""
        assert self._container_info is not None and self._state is not None
        await self._exec_checked(checkpoints.stop_bridge_command(), "stop the kernel's bridge")
        self._state.open_for_kernel()
        command = checkpoints.bridge_command(KERNEL_PYTHON, self._container_info)
        await self._exec_checked(command, "start the kernel's bridge")

    async def _exec_checked(self, argv: list[str], what: str) -> None:
        result = await self.exec(argv, max_output_bytes=4096, deadline=self.config.startup_timeout)
        if result.exit_code != 0:
            raise KernelError(
                f"could not {what} in sandbox {self.sandbox_id} (exit {result.exit_code}): "
                + result.stderr.decode(errors="replace")[-500:]
            )

    def egress_refusals(self) -> list[Decision]:
        return self.egress.take_refusals() if self.egress is not None else []

    async def kill(self, restart: bool = False) -> None:
        self._check_own("kill it")
        if self.resource_id is not None:
            await self.engine.kill(self.resource_id)

    async def cleanup(self, restart: bool = False) -> None:
        """Remove the container, its volumes and the host-side run directory.

        ``restart=True`` keeps all of them: :meth:`restart_whole` reuses the container.
        """
        if restart:
            return
        if not self._own:  # a guest leaves: the sandbox is its owner's
            return
        _unclosed.pop(self.sandbox_id, None)
        try:
            if self.resource_id is not None:
                await self.engine.remove(self.resource_id)
            await self.engine.remove_volumes(self._volumes)  # in use until the container goes
            if self.network is not None:
                await self.engine.remove_network(self.network)
        finally:
            if self._state is not None:
                self._state.close()
            if self.egress is not None:
                await self.egress.close()

    async def detach(self) -> None:
        """Release the claim (run directory or adoption) and the status channel; remove
        nothing."""
        _unclosed.pop(self.sandbox_id, None)
        self._own = False
        if self._state is not None:
            self._state.release()
        self._state = GuestStateDir()

    def remove_blocking(self) -> None:
        """:meth:`cleanup` without an event loop (at interpreter exit)."""
        _unclosed.pop(self.sandbox_id, None)
        try:
            if self.resource_id is not None:
                self.engine.remove_blocking(self.resource_id)
            self.engine.remove_volumes_blocking(self._volumes)
            if self.network is not None:
                self.engine.remove_network_blocking(self.network)
        finally:
            if self._state is not None:
                self._state.close()
            if self.egress is not None:  # the proxy ends with this process
                shutil.rmtree(self.egress.host_dir, ignore_errors=True)

    async def logs(self, tail: int) -> str:
        if self.resource_id is None:
            return ""
        return await self.engine.logs(self.resource_id, tail=tail)

    # -- beside the kernel -------------------------------------------------------------

    async def exec(
        self,
        argv: list[str],
        *,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        return await self._exec(
            argv,
            workdir=workdir,
            environment=env,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            deadline=deadline,
        )

    async def exec_stream(
        self,
        argv: list[str],
        *,
        stdin: AsyncIterable[bytes] | None = None,
        stdout: Callable[[bytes], Awaitable[None]],
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        return await self._exec(
            argv, stdin=stdin, stdout=stdout, max_output_bytes=max_output_bytes, deadline=deadline
        )

    async def _exec(self, argv: list[str], **options: Any) -> ExecResult:
        """One process beside the kernel, as the sandbox user (both ``exec`` forms)."""
        container = self._container()
        return await exec_process(
            self.engine.api,
            container,
            argv,
            user=self.config.user,
            container_state=lambda: self.engine.state(container),
            **options,
        )

    def _check_own(self, what: str) -> None:
        if not self._own:
            raise KernelError(f"a guest attached to sandbox {self.sandbox_id} cannot {what}")

    def _container(self) -> str:
        if self.resource_id is None:
            raise SandboxError(f"sandbox {self.sandbox_id} has no container (not launched)")
        return self.resource_id

    # -- the engine as a whole -----------------------------------------------------------

    @classmethod
    async def list_sandboxes(cls, labels: dict[str, str]) -> list[SandboxRecord]:
        return await DockerEngine().list(labels)

    @classmethod
    async def gc(cls, *, remove_all: bool = False) -> list[Leftover]:
        return await find_leftovers(DockerEngine(), remove_all=remove_all)

    @classmethod
    async def remove_sandboxes(
        cls, labels: dict[str, str], *, keep: frozenset[str] = frozenset()
    ) -> int:
        return await remove_labelled(DockerEngine(), labels, keep)
