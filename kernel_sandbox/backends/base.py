"""The abstract container backend: what a sandbox needs from an engine, nothing more.

Modelled on jupyter_client's kernel provisioners (launch, poll, kill, cleanup): the
sandbox never talks to an engine directly, so other engines (Swarm, Kubernetes) can
be added beside ``docker.py``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "REMOVED_REASON",
    "Backend",
    "ContainerSpec",
    "ContainerState",
    "ExecResult",
    "ImageUser",
]

#: Why a sandbox whose container was deleted behind its back cannot go on.
REMOVED_REASON = (
    "its container was removed from outside (e.g. `docker rm -f`), so its files and "
    "variables are gone; create a new sandbox"
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
    #: :meth:`Backend.remove_network`, labelled like the container for ``gc``
    own_network: str | None = None
    #: mount the image's root filesystem read-only (writes go to ``volumes`` only)
    read_only: bool = False
    #: bytes of /dev/shm (None: the engine's default)
    shm_size: int | None = None
    #: the engine's OCI runtime, e.g. ``"runsc"`` (None: the engine's default)
    runtime: str | None = None


@dataclass(frozen=True)
class ImageUser:
    """Who a container of an image runs as: numeric ids and home directory."""

    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class ContainerState:
    """What the engine says about a container right now."""

    running: bool
    exit_code: int | None = None
    oom_killed: bool = False
    error: str = ""
    #: The container no longer exists (removed from outside); nothing can restart it.
    removed: bool = False

    def death_reason(self) -> str:
        """A sentence for a user: why the container's main process is gone."""
        if self.removed:
            return REMOVED_REASON
        if self.oom_killed:
            return "the kernel ran out of memory (killed by the OOM killer; raise memory_limit)"
        if self.exit_code is not None and self.exit_code > 128:
            import signal

            try:
                name = signal.Signals(self.exit_code - 128).name
            except ValueError:
                name = f"signal {self.exit_code - 128}"
            return f"the kernel process was killed by {name}"
        detail = f" ({self.error})" if self.error else ""
        return f"the kernel process exited with code {self.exit_code}{detail}"


@dataclass(frozen=True)
class ExecResult:
    """The outcome of a process run beside the kernel."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    #: Bytes dropped from the middle of stdout and stderr by ``max_output_bytes``.
    truncated_bytes: int = 0


class Backend(abc.ABC):
    """An engine that runs sandbox containers."""

    @abc.abstractmethod
    async def start(self, spec: ContainerSpec) -> str:
        """Create and start a container; return its id."""

    @abc.abstractmethod
    async def image_user(self, image: str, user: str) -> ImageUser:
        """Resolve ``user`` (a name or ``uid[:gid]``) in ``image``'s own user database.

        Needed to give in-memory volumes to the user before any container runs.
        """

    @abc.abstractmethod
    async def create_volume(
        self, name: str, *, size: int, uid: int, gid: int, mode: int, labels: dict[str, str]
    ) -> None:
        """Create an in-memory volume holding at most ``size`` bytes.

        Its root directory belongs to ``uid``:``gid`` with permission bits ``mode``.
        Unlike a container's own tmpfs mounts, a volume is reachable through
        :meth:`put_archive` and :meth:`get_archive` even on a read-only root filesystem.
        """

    @abc.abstractmethod
    async def remove_volumes(self, names: list[str]) -> None:
        """Delete volumes no container uses any more; missing ones are not an error."""

    @abc.abstractmethod
    def remove_volumes_blocking(self, names: list[str]) -> None:
        """``remove_volumes`` without an event loop (used at interpreter exit)."""

    @abc.abstractmethod
    async def list_volumes(self, labels: dict[str, str]) -> list[dict[str, object]]:
        """Volumes carrying all these labels: name, labels."""

    async def remove_network(self, name: str) -> None:  # noqa: B027 (engines without any)
        """Delete a network made for one container (``ContainerSpec.own_network``)."""

    @abc.abstractmethod
    async def state(self, container_id: str) -> ContainerState:
        """Poll the container; a removed one is ``ContainerState(removed=True)``."""

    @abc.abstractmethod
    async def restart(
        self, container_id: str, before_start: Callable[[], None] | None = None
    ) -> None:
        """Kill the main process (if alive) and start the same container again.

        ``before_start`` is called once the old container has stopped (none of its
        processes is left) and before the new one starts.
        """

    @abc.abstractmethod
    async def signal(self, container_id: str, signal: str) -> None:
        """Send a signal (e.g. ``"SIGUSR1"``) to the container's main process.

        Raises :class:`~kernel_sandbox.errors.KernelError` if the container is gone or
        not running.
        """

    @abc.abstractmethod
    async def remove(self, container_id: str) -> None:
        """Kill and delete the container; a missing container is not an error."""

    @abc.abstractmethod
    def remove_blocking(self, container_id: str) -> None:
        """``remove`` without an event loop (used at interpreter exit)."""

    @abc.abstractmethod
    async def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
        max_output_bytes: int | None = None,
        stdin: bytes | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        """Run a process in the container beside the kernel and wait for it.

        With ``max_output_bytes``, stdout and stderr are each read as a stream and
        keep only their head and tail within it (see :class:`~kernel_sandbox.limits.HeadTail`),
        so a process printing gigabytes never fills host memory.  ``stdin`` is sent to
        the process, then closed.  With ``deadline`` (seconds) the host stops waiting
        then and raises :class:`~kernel_sandbox.errors.FileOperationError`: a process the
        sandbox can stop (its own user's) must never hold the host.
        """

    @abc.abstractmethod
    async def put_archive(self, container_id: str, directory: str, tar_bytes: bytes) -> None:
        """Extract a tar archive into an existing directory of the container."""

    @abc.abstractmethod
    async def get_archive(
        self, container_id: str, path: str, max_bytes: int | None = None
    ) -> bytes:
        """A tar archive of ``path`` in the container.

        With ``max_bytes``, a path whose content is larger is refused with a
        :class:`~kernel_sandbox.errors.FileOperationError` before it is read into memory.
        """

    @abc.abstractmethod
    async def logs(self, container_id: str, tail: int) -> str:
        """The last ``tail`` lines the container's main process wrote (for start errors)."""

    @abc.abstractmethod
    async def address(self, container_id: str) -> str:
        """The container's IP address on its network (tcp transport)."""

    @abc.abstractmethod
    async def list(self, labels: dict[str, str]) -> list[dict[str, object]]:
        """Containers carrying all these labels: id, name, status, labels, created."""
