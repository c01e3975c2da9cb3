"""The Docker engine, on the docker SDK's low-level API: containers, volumes, listings.

:class:`DockerEngine` is the only place (with ``exec.py``, ``transfer.py`` and
``images/``) that calls the SDK; :class:`~.host.DockerHost` drives it for one sandbox.

The low-level API is used on purpose: ``containers.run`` inspects the container again
after starting it, which costs a round trip on every sandbox start.  Every blocking
SDK call runs in a worker thread so the event loop never waits on the engine.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tarfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig, Ulimit

from ...config import LABEL_PREFIX
from ...errors import (
    ContainerRemovedError,
    ContainerStoppedError,
    EngineUnavailableError,
    ImageNotFoundError,
    KernelError,
    SandboxStartError,
)
from ...limits import ENGINE_LOG_TAIL_BYTES
from ...threads import after_fork, in_process_thread, in_thread
from ..base import REMOVED_REASON, HostState, SandboxRecord
from .runtimes import Runtime, engine_runtimes, gvisor_host_pids, validate

__all__ = [
    "ContainerSpec",
    "DockerEngine",
    "ImageUser",
    "docker_client",
    "run_in_process_thread",
    "run_in_thread",
]

T = TypeVar("T")
#: The engine's log of a sandbox: what the kernel writes to its original fd 1/2 (or to
#: ``/proc/1/fd/1``) lands here, on the host's disk, outside ``disk_limit``.  It is only
#: read for the last lines of a failed start, so it is kept small: ``max-file`` files of
#: ``max-size`` each, rotated by the engine as it writes (at most 2 MiB per sandbox).
ENGINE_LOG = LogConfig(type="json-file", config={"max-size": "1m", "max-file": "2"})

ENGINE_HELP = (
    "Cannot reach the Docker engine{where}: {error}. Start it (`sudo systemctl start docker`, "
    "or run `dockerd &` as root), or point DOCKER_HOST at a running engine; a non-root user "
    "also needs to be in the `docker` group."
)


@dataclass(frozen=True)
class ContainerSpec:
    """Everything needed to create one sandbox container."""

    image: str
    command: list[str]
    user: str
    working_dir: str
    environment: dict[str, str]
    volumes: dict[str, dict[str, str]]
    labels: dict[str, str]
    memory_limit: str
    cpu_limit: float
    pids_limit: int
    network_enabled: bool
    name: str | None = None
    #: container port -> host port on 127.0.0.1 (tcp transport with a network)
    published_ports: dict[int, int] = field(default_factory=dict)
    #: a network made for this container alone (tcp transport: no other sandbox can
    #: reach its kernel); internal unless ``network_enabled``, removed by
    #: :meth:`DockerEngine.remove_network`, labelled like the container for ``gc``
    own_network: str | None = None
    #: mount the image's root filesystem read-only (writes go to ``volumes`` only)
    read_only: bool = False
    #: bytes of /dev/shm (None: the engine's default)
    shm_size: int | None = None
    #: the engine's OCI runtime, e.g. ``"runsc"`` (None: the engine's default)
    runtime: str | None = None
    #: in-memory file systems (path -> mount options): under gVisor they are the
    #: sandbox's own memory, which a checkpoint carries (see ``writable.py``)
    tmpfs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageUser:
    """Who a container of an image runs as: numeric ids and home directory."""

    uid: int
    gid: int
    home: str


@functools.lru_cache(maxsize=1)
def docker_client() -> docker.DockerClient:
    """One client per process (it holds a connection pool), checked with a ping."""
    where = f" at {os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else ""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        docker_client.cache_clear()
        raise EngineUnavailableError(ENGINE_HELP.format(where=where, error=exc)) from exc
    except Exception as exc:  # requests' ConnectionError and friends
        docker_client.cache_clear()
        raise EngineUnavailableError(ENGINE_HELP.format(where=where, error=exc)) from exc
    return client


# the client's pooled connections to the engine are shared with the parent after fork()
after_fork(docker_client.cache_clear)


async def run_in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the SDK in a worker thread; faults outside our control become SandboxErrors.

    The engine going away mid-session (stopped, restarted, socket gone) is
    ``EngineUnavailableError``; a container deleted or stopped behind the sandbox's back
    is ``ContainerRemovedError`` / ``ContainerStoppedError``, never a raw SDK traceback.
    Other SDK errors pass through for the caller to put in its own words.
    """
    return await _translated(in_thread(fn, *args, **kwargs))


async def run_in_process_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """:func:`run_in_thread` for a call that lasts as long as a process in the sandbox
    (an exec): on a thread of its own (``threads.in_process_thread``)."""
    return await _translated(in_process_thread(fn, *args, **kwargs))


async def _translated(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except docker.errors.NotFound as exc:
        if "no such container" in str(exc).lower():
            raise ContainerRemovedError(f"the sandbox cannot be used: {REMOVED_REASON}") from exc
        raise
    except docker.errors.APIError as exc:
        if exc.status_code == 409 and "is not running" in str(exc):
            raise ContainerStoppedError(
                "the sandbox's container is not running (it was stopped or killed from "
                "outside); run_python or restart() starts it again (files are kept, "
                "variables are lost)"
            ) from exc
        raise
    except requests.exceptions.ConnectionError as exc:
        where = f" at {os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else ""
        raise EngineUnavailableError(ENGINE_HELP.format(where=where, error=exc)) from exc


#: How long the runtimes an engine offers are remembered for the process, in seconds.
RUNTIMES_TTL = 60.0
# engine address -> (when asked, its runtimes)
_known_runtimes: dict[str, tuple[float, dict[str, Runtime]]] = {}

# (image, user) -> ImageUser, for the process: a user database does not change under a tag
# often enough to pay a probe container on every sandbox start.
_image_users: dict[tuple[str, str], ImageUser] = {}
_image_user_locks: dict[tuple[str, str], threading.Lock] = {}
_image_user_guard = threading.Lock()


def _lookup(database: str, key: str) -> list[str] | None:
    """The fields of the /etc/passwd or /etc/group line whose name or numeric id is ``key``."""
    for line in database.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and key in (fields[0], fields[2]):
            return fields
    return None


class DockerEngine:
    """Sandbox containers and volumes on a local or remote Docker engine (async calls)."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self._client = client
        self._runtimes: dict[str, Runtime] | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker_client()
        return self._client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    async def start(self, spec: ContainerSpec) -> str:
        return str(await run_in_thread(self._start_sync, spec))

    async def create(self, spec: ContainerSpec) -> str:
        """Create the container without starting it (a start from a checkpoint follows)."""
        return str(await run_in_thread(self._create_sync, spec))

    async def runtimes(self) -> dict[str, Runtime]:
        """The OCI runtimes the engine offers (``docker info``), asked afresh."""
        return await run_in_thread(self._runtimes_sync, True)  # type: ignore[no-any-return]

    def _runtimes_sync(self, refresh: bool = False) -> dict[str, Runtime]:
        # Asked once per engine address every RUNTIMES_TTL seconds (each sandbox has its
        # own DockerEngine, and `docker info` on every start was an engine round trip
        # that grows with the containers the engine has), and again when a sandbox
        # names one not seen yet (the engine may have been given it since: daemon.json
        # and a reload).
        if self._runtimes is None or refresh:
            key = str(self.api.base_url)
            known = _known_runtimes.get(key)
            if refresh or known is None or time.monotonic() - known[0] > RUNTIMES_TTL:
                known = (time.monotonic(), engine_runtimes(self.api.info()))
                _known_runtimes[key] = known
            self._runtimes = known[1]
        return self._runtimes

    def _start_sync(self, spec: ContainerSpec) -> str:
        container_id = self._create_sync(spec)
        try:
            self.api.start(container_id)
        except docker.errors.APIError as exc:
            self.remove_blocking(container_id)
            raise SandboxStartError(f"the engine could not start the container: {exc}") from exc
        return container_id

    def _create_sync(self, spec: ContainerSpec) -> str:
        api = self.api
        runtimes = self._runtimes_sync()
        if spec.runtime is not None and spec.runtime not in runtimes:
            runtimes = self._runtimes_sync(refresh=True)
        runtime = validate(runtimes, spec)
        pids_limit, ulimits = spec.pids_limit, [Ulimit(name="core", soft=0, hard=0)]
        if runtime is not None and runtime.gvisor:  # see runtimes.py: counted inside
            ulimits.append(Ulimit(name="nproc", soft=spec.pids_limit, hard=spec.pids_limit))
            pids_limit = gvisor_host_pids(spec.pids_limit)
        network_mode = "bridge" if spec.network_enabled else "none"
        if spec.own_network:
            self._create_own_network(spec)
            network_mode = spec.own_network
        host_config = api.create_host_config(
            binds=spec.volumes,
            init=True,
            mem_limit=spec.memory_limit,
            memswap_limit=spec.memory_limit,  # no swap: the limit is the limit
            nano_cpus=int(spec.cpu_limit * 1e9),
            pids_limit=pids_limit,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            network_mode=network_mode,
            port_bindings={p: ("127.0.0.1", h) for p, h in spec.published_ports.items()} or None,
            ulimits=ulimits,
            read_only=spec.read_only,
            shm_size=spec.shm_size,
            tmpfs=dict(spec.tmpfs) or None,
            runtime=spec.runtime,
            log_config=ENGINE_LOG,
        )
        try:
            created = api.create_container(
                spec.image,
                command=spec.command,
                user=spec.user,
                working_dir=spec.working_dir,
                environment=spec.environment,
                labels=spec.labels,
                host_config=host_config,
                name=spec.name,
                ports=list(spec.published_ports) or None,
                detach=True,
            )
        except docker.errors.ImageNotFound as exc:
            raise ImageNotFoundError(
                f"image {spec.image!r} is not on this engine: build it with "
                f"`kernel-sandbox images build` or set `image=` to one that exists"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxStartError(f"the engine refused to create the container: {exc}") from exc
        return str(created["Id"])

    def _create_own_network(self, spec: ContainerSpec) -> None:
        """A bridge for one container: no other container is on it, so none reaches it.

        The shared network of old let sandbox A subscribe to sandbox B's iopub.  Without
        ``network_enabled`` it is internal (no route outside).
        """
        assert spec.own_network is not None
        try:
            self.api.create_network(
                spec.own_network,
                driver="bridge",
                internal=not spec.network_enabled,
                labels=spec.labels,
                check_duplicate=True,
            )
        except docker.errors.APIError as exc:
            raise SandboxStartError(
                f"the engine could not create the sandbox's network {spec.own_network}: "
                f"{exc.explanation or exc}"
            ) from exc

    async def remove_network(self, name: str) -> None:
        await run_in_thread(self.remove_network_blocking, name)

    def remove_network_blocking(self, name: str) -> None:
        """Remove a sandbox's own network; a missing one is not an error."""
        with contextlib.suppress(docker.errors.NotFound):
            self.api.remove_network(name)

    async def list_networks(self, labels: dict[str, str]) -> list[dict[str, object]]:
        """Networks carrying all these labels: name, labels."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = await run_in_thread(self.api.networks, filters=filters)
        return [{"name": n["Name"], "labels": n.get("Labels") or {}} for n in found or []]

    async def image_user(self, image: str, user: str) -> ImageUser:
        hit = _image_users.get((image, user))
        if hit is None:
            hit = await run_in_thread(self._image_user_once, image, user)
        return hit

    def _image_user_once(self, image: str, user: str) -> ImageUser:
        # Sandboxes started at once on an image not probed yet share one probe (16 at a
        # time made 16 probe containers).
        with _image_user_guard:
            lock = _image_user_locks.setdefault((image, user), threading.Lock())
        with lock:
            hit = _image_users.get((image, user))
            if hit is None:
                hit = _image_users[(image, user)] = self._image_user_sync(image, user)
            return hit

    def _image_user_sync(self, image: str, user: str) -> ImageUser:
        # A container that is created but never started: its files can be read through
        # the archive API without running anything from the image.
        name, _, group = user.partition(":")
        probe = self.api.create_container(
            image,
            command=["true"],
            labels={LABEL_PREFIX: "true", f"{LABEL_PREFIX}.probe": "user"},
            host_config=self.api.create_host_config(network_mode="none"),
        )["Id"]
        try:
            passwd = _lookup(self._read_file(probe, "/etc/passwd"), name)
            groups = self._read_file(probe, "/etc/group") if group and not group.isdigit() else ""
        finally:
            self.remove_blocking(probe)
        if passwd is None and not name.isdigit():
            raise SandboxStartError(
                f"user {name!r} does not exist in image {image!r}; set `user=` to one that "
                "does, or to a numeric uid"
            )
        uid = int(name) if passwd is None else int(passwd[2])
        gid = int(passwd[3]) if passwd is not None and len(passwd) > 3 else uid
        if group:
            entry = _lookup(groups, group)
            if entry is None and not group.isdigit():
                raise SandboxStartError(f"group {group!r} does not exist in image {image!r}")
            gid = int(group) if entry is None else int(entry[2])
        env = dict(
            item.split("=", 1)
            for item in self.api.inspect_image(image)["Config"].get("Env") or []
            if "=" in item
        )
        home = env.get("HOME") or (passwd[5] if passwd is not None and len(passwd) > 5 else "/")
        return ImageUser(uid, gid, home)

    def _read_file(self, container_id: str, path: str) -> str:
        try:
            stream, _ = self.api.get_archive(container_id, path)
        except docker.errors.NotFound:
            return ""
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            return handle.read().decode(errors="replace") if handle is not None else ""

    async def create_volume(
        self, name: str, *, size: int, uid: int, gid: int, mode: int, labels: dict[str, str]
    ) -> None:
        # The local driver mounts this tmpfs on the engine's side, which is what lets the
        # archive API (and so sandbox.files) reach it on a read-only root filesystem.
        options = f"size={size},uid={uid},gid={gid},mode={mode:o}"
        try:
            await run_in_thread(
                self.api.create_volume,
                name,
                driver="local",
                driver_opts={"type": "tmpfs", "device": "tmpfs", "o": options},
                labels=labels,
            )
        except docker.errors.APIError as exc:
            raise SandboxStartError(f"the engine could not create volume {name}: {exc}") from exc

    async def remove_volumes(self, names: list[str]) -> None:
        await run_in_thread(self.remove_volumes_blocking, names)

    def remove_volumes_blocking(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(docker.errors.NotFound):
                self.api.remove_volume(name, force=True)

    async def list_volumes(self, labels: dict[str, str]) -> list[dict[str, object]]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = await run_in_thread(self.api.volumes, filters=filters)
        return [
            {"name": v["Name"], "labels": v.get("Labels") or {}}
            for v in (found or {}).get("Volumes") or []
        ]

    async def state(self, container_id: str) -> HostState:
        try:
            info = await run_in_thread(self.api.inspect_container, container_id)
        except ContainerRemovedError:
            return HostState(running=False, removed=True)
        st = info["State"]
        return HostState(
            running=bool(st["Running"]),
            exit_code=None if st["Running"] else int(st["ExitCode"]),
            oom_killed=bool(st.get("OOMKilled")),
            error=str(st.get("Error") or ""),
        )

    async def restart(
        self, container_id: str, before_start: Callable[[], None] | None = None
    ) -> None:
        def _restart() -> None:
            with contextlib.suppress(docker.errors.APIError):  # already stopped
                self.api.kill(container_id)
            self.api.wait(container_id, timeout=30)
            if before_start is not None:
                before_start()
            self.api.start(container_id)

        await run_in_thread(_restart)

    async def kill(self, container_id: str) -> None:
        """Kill the container's main process; a stopped container is not an error."""

        def _kill() -> None:
            with contextlib.suppress(docker.errors.APIError):  # already stopped
                self.api.kill(container_id)

        await run_in_thread(_kill)

    async def signal(self, container_id: str, signal: str) -> None:
        try:
            await run_in_thread(self.api.kill, container_id, signal=signal)
        except ContainerStoppedError as exc:  # stopped or removed: _run says which
            raise KernelError(str(exc)) from exc
        except docker.errors.APIError as exc:
            raise KernelError(f"could not signal the container: {exc.explanation}") from exc

    async def remove(self, container_id: str) -> None:
        await run_in_thread(self.remove_blocking, container_id)

    def remove_blocking(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise

    async def logs(self, container_id: str, tail: int) -> str:
        raw = await run_in_thread(self.api.logs, container_id, tail=tail)
        return bytes(raw)[-ENGINE_LOG_TAIL_BYTES:].decode(errors="replace")

    async def inspect(self, container_id: str) -> dict[str, Any]:
        """The engine's full description of a container (``docker inspect``)."""
        info: dict[str, Any] = await run_in_thread(self.api.inspect_container, container_id)
        return info

    async def address(self, container_id: str) -> str:
        info = await run_in_thread(self.api.inspect_container, container_id)
        for net in info["NetworkSettings"]["Networks"].values():
            if net.get("IPAddress"):
                return str(net["IPAddress"])
        raise SandboxStartError("the container has no IP address; the tcp transport needs one")

    async def list(self, labels: dict[str, str]) -> list[SandboxRecord]:
        """Containers carrying all these labels, running or not."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        rows = await run_in_thread(self.api.containers, all=True, filters=filters)
        return [
            SandboxRecord(
                host="docker",
                resource_id=str(r["Id"]),
                name=(r.get("Names") or ["?"])[0].lstrip("/"),
                image=str(r.get("Image") or ""),
                state=str(r.get("State") or ""),
                labels=r.get("Labels") or {},
                created=float(r["Created"]) if r.get("Created") is not None else None,
            )
            for r in rows
        ]
