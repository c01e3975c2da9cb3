"""The kernel host interface: everything engine-specific about one sandbox.

A :class:`KernelHost` is made for one sandbox and owns whatever its engine needs to run
a kernel there: image resolution, the container (or pod, or process), the writable
area, the run directory, the transport and the connection info, the supervisor
protocol (kernel ended, restart in place, restart whole), processes and files beside
the kernel, and cleanup.  It is shaped like jupyter_client's ``KernelProvisionerBase``
(``launch_kernel`` -> connection info, ``poll``, ``send_signal``,
``kill``/``cleanup(restart=)``), and hosts are found by name through the entry-point
group :data:`HOSTS_GROUP`, as jupyter_client's provisioner factory finds provisioners
(see :mod:`kernel_sandbox.backends.factory`).

What :class:`~kernel_sandbox.sandbox.AsyncSandbox` does with a host, in order::

    info = await host.launch()          # kernel starting; connect a client to ``info``
    await host.post_launch()            # connect attempt over (e.g. seal the run directory)
    await host.poll()                   # often, while a cell runs: None, or why it died
    await host.exec([...], stdin=...)   # processes and files beside the kernel, any time
    info = await host.restart_kernel()  # in place (files kept); KernelError if it cannot
    info = await host.restart_whole()   # the fallback (files may be lost)
    await host.post_launch()            # after every (re)connect attempt
    await host.cleanup()                # close: remove everything; safe twice

The sandbox layer (session, lock, events) never learns which engine runs it; nothing
above this interface imports an engine's SDK.

Interface history (hosts outside this package are written against it):

* 1 — first version.
* 1.1 — added :func:`owner_alive` (additive).
* 2 — file transfer is ``exec`` with stdin/stdout as the sandbox user (main's security
  work): ``read_file``/``write_file`` are gone (the sandbox's ``files`` runs its
  scripts through :meth:`KernelHost.exec`, the same on every host); ``exec`` gained
  ``deadline``; :attr:`KernelHost.protected_paths` names what the file API refuses;
  :meth:`KernelHost.post_launch` is called after every connect attempt, failed ones too.
* 2.1 — added :meth:`KernelHost.attach` (additive; the default says the host cannot):
  reconnect to a sandbox another process launched, without restarting its kernel.
* 2.2 — added :meth:`KernelHost.egress_refusals` (additive, with a default).
* 2.3 — added :meth:`KernelHost.exec_stream` (additive; the default buffers through
  :meth:`KernelHost.exec`): stdin from an async iterable, stdout to an async sink, so
  a file larger than the host would hold moves through it.
* 2.4 — added :meth:`KernelHost.remove_sandboxes` (additive; the default removes
  nothing and says so): a server removes what a killed predecessor left on any host.
* 2.5 — added :func:`this_owner` (additive): the owner labels an adopter that can
  relabel puts on, so gc does not take what it adopted for an orphan.
* 2.6 — added :meth:`KernelHost.snapshot_places` (additive, with a default): the
  directories a portable snapshot carries.
* 2.7 — added :meth:`KernelHost.open_context` (additive; the default says the host
  cannot) and :attr:`KernelHost.kernel_python`: another kernel in the same sandbox, on
  a host of its own that shares this one's files and processes; the kernel launched
  is ``config.kernel``'s kernelspec, any the image holds.
* 2.8 — added :meth:`KernelHost.exact_refusal`, :meth:`KernelHost.checkpoint`,
  :meth:`KernelHost.resume_checkpoint` and :meth:`KernelHost.restore_checkpoint`
  (additive; the defaults say the host cannot): exact snapshots, the whole sandbox by
  its runtime's checkpoint.
* 2.9 — added :meth:`KernelHost.election` and :class:`Election` (additive; the default
  is None: the host's engine elects nobody): one holder at a time among processes
  that share a name (server replicas' reaper), by the engine's own primitive.
"""

from __future__ import annotations

import abc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from ..config import KERNEL_PYTHON, LABEL_PREFIX
from ..errors import KernelError, SnapshotError
from ..kernel.connection import ConnectionInfo

if TYPE_CHECKING:
    from ..config import SandboxConfig
    from ..network import Decision

log = logging.getLogger(__name__)

__all__ = [
    "HOSTS_GROUP",
    "REMOVED_REASON",
    "ConnectionInfo",
    "Election",
    "ExecResult",
    "HostState",
    "KernelHost",
    "Leftover",
    "SandboxRecord",
    "owner_alive",
    "owner_labels",
    "this_owner",
]

#: The entry-point group hosts register under: ``name = "package.module:HostClass"``.
HOSTS_GROUP = "kernel_sandbox.hosts"

#: Why a sandbox whose container (pod, ...) was deleted behind its back cannot go on.
REMOVED_REASON = (
    "its container was removed from outside (e.g. `docker rm -f`), so its files and "
    "variables are gone; create a new sandbox"
)


class Election(Protocol):
    """One holder at a time among processes that share a name (see
    :meth:`KernelHost.election`)."""

    async def hold(self) -> bool:
        """Take or renew the holding; whether this process holds it now.  Call it more
        often than the duration the election was made with, to keep it."""

    async def release(self) -> None:
        """Give the holding up if this process has it (the next candidate need not
        wait for it to run out)."""


@dataclass(frozen=True)
class HostState:
    """What the engine says about what hosts a sandbox's kernel, right now."""

    running: bool
    exit_code: int | None = None
    oom_killed: bool = False
    error: str = ""
    #: It no longer exists (removed from outside); nothing can restart it.
    removed: bool = False

    def death_reason(self) -> str:
        """A sentence for a user: why the kernel (or what hosts it) is gone."""
        if self.removed:
            return REMOVED_REASON
        if self.oom_killed:
            return "the kernel ran out of memory (killed by the OOM killer; raise memory_limit)"
        if self.exit_code is not None and self.exit_code > 128:
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


@dataclass(frozen=True)
class SandboxRecord:
    """One sandbox an engine knows of (``kernel-sandbox ps``, gc, pools)."""

    #: The host's entry-point name (``"docker"``, ``"kubernetes"``, ...).
    host: str
    #: The engine's id of what runs the sandbox (container id, pod name).
    resource_id: str
    name: str
    image: str
    #: The engine's word for its state; ``"running"`` when the kernel can run.
    state: str
    labels: dict[str, str] = field(default_factory=dict)
    #: Unix time it was created, if the engine says.
    created: float | None = None

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id, from its labels ("?" if the engine lost them)."""
        return self.labels.get(f"{LABEL_PREFIX}.id", "?")

    @property
    def running(self) -> bool:
        """True when the engine says it runs."""
        return self.state == "running"


@dataclass(frozen=True)
class Leftover:
    """One thing :meth:`KernelHost.gc` found and may remove: what to call it, and how."""

    what: str
    remove: Callable[[], Awaitable[None]]


def owner_labels(sandbox_id: str, config: SandboxConfig) -> dict[str, str]:
    """The labels every host puts on what it creates, so gc can always find orphans."""
    return {
        LABEL_PREFIX: "true",
        f"{LABEL_PREFIX}.id": sandbox_id,
        **this_owner(),
        **config.labels,
    }


def this_owner() -> dict[str, str]:
    """The owner labels naming this process (an adopter that can relabel puts these on)."""
    return {
        f"{LABEL_PREFIX}.owner-pid": str(os.getpid()),
        f"{LABEL_PREFIX}.owner-host": socket.gethostname(),
    }


def owner_alive(labels: dict[str, str]) -> bool | None:
    """Whether the process that made a sandbox still runs (None: made on another host)."""
    if labels.get(f"{LABEL_PREFIX}.owner-host") != socket.gethostname():
        return None
    try:
        os.kill(int(labels.get(f"{LABEL_PREFIX}.owner-pid", "0")), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


class KernelHost(abc.ABC):
    """Runs one sandbox's kernel on some engine, and processes and files beside it.

    Subclasses implement the abstract methods; they raise
    :class:`~kernel_sandbox.errors.SandboxError` subclasses only (engine SDK errors are
    translated: :class:`~kernel_sandbox.errors.EngineUnavailableError`,
    :class:`~kernel_sandbox.errors.ContainerStoppedError`,
    :class:`~kernel_sandbox.errors.ContainerRemovedError`, ...).  Every byte that comes
    back from the sandbox is bounded (``max_output_bytes``, ``max_bytes``), and every
    process and file operation acts as the sandbox user, never as root on a path the
    sandbox controls.  A host is used by one sandbox, which serialises lifecycle calls;
    ``exec``/``poll``/``state`` may run concurrently with a cell.
    """

    #: The entry-point name this host is registered under.
    name: ClassVar[str] = ""

    def __init__(self, sandbox_id: str, config: SandboxConfig) -> None:
        self.sandbox_id = sandbox_id
        self.config = config
        #: The image the kernel runs in, once :meth:`launch` resolved it.
        self.image = config.image
        #: The engine's id of what runs the sandbox (container id, pod name), once made.
        self.resource_id: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        """Labels for everything this host creates (see :func:`owner_labels`)."""
        return owner_labels(self.sandbox_id, self.config)

    @property
    def working_dir(self) -> str:
        """Where relative sandbox paths start (an absolute path inside the sandbox)."""
        return self.config.working_dir

    @property
    def protected_paths(self) -> tuple[str, ...]:
        """Absolute sandbox paths the file API refuses, whatever link leads there
        (e.g. a directory shared with the host for the kernel's connection)."""
        return ()

    def snapshot_places(self, tmp: bool = False) -> dict[str, str]:
        """The directories a portable snapshot saves and restores, by key: ``work`` (the
        working directory), ``home`` (``~``: the kernel's $HOME, packages installed at
        run time included) and, with ``tmp``, ``/tmp``.  Paths are seen from inside."""
        places = {"work": self.working_dir, "home": "~"}
        if tmp:
            places["tmp"] = "/tmp"
        return places

    @property
    def kernel_python(self) -> str:
        """The sandbox's Python with jupyter_client (its kernelspecs are listed with it)."""
        return KERNEL_PYTHON

    async def open_context(self, context_id: str, kernel: str, cwd: str) -> KernelHost:
        """A host for another kernel in this sandbox: kernelspec ``kernel``, started in
        ``cwd``, beside this host's own kernel, with the same files, processes and
        limits.  Its :meth:`launch` starts it; its :meth:`cleanup` ends only it; its
        ``exec`` is this host's.  Raises :class:`~kernel_sandbox.errors.KernelError`
        when this host cannot run a second kernel."""
        raise KernelError(
            f"the {self.name or type(self).__name__} host runs one kernel per sandbox: "
            "create another sandbox for another language"
        )

    # -- the kernel's lifecycle -------------------------------------------------------

    @abc.abstractmethod
    async def launch(self) -> ConnectionInfo:
        """Create what runs the kernel and start it; return how to reach it from here.

        The returned info is for a client in *this* process (host paths, reachable
        addresses); the kernel may still be starting.  On failure the caller calls
        :meth:`cleanup`, which must remove whatever was made half-way.
        """

    async def attach(self, record: SandboxRecord, *, own: bool = True) -> ConnectionInfo:
        """Reach the kernel of a sandbox another process launched; do not restart it.

        ``record`` is what :meth:`list_sandboxes` found (its labels carry the sandbox id
        and where its host-side pieces are; never its keys).  The connection info
        (ports or socket path, the HMAC key, CURVE keys) is recovered from where only
        the host can read it, and returned as :meth:`launch` returns it; the caller
        connects a client and calls :meth:`post_launch`.

        ``own=True`` (adoption: e.g. a server restarted after a crash) makes this host
        the sandbox's owner: :meth:`cleanup` removes it, restarts work.  ``own=False``
        (a guest, e.g. a person's console beside the owner) never removes or restarts
        anything and leaves the owner's channels (the supervisor's reports) alone.
        Raises :class:`~kernel_sandbox.errors.KernelError` when it cannot.
        """
        raise KernelError(f"the {self.name or type(self).__name__} host cannot attach to a sandbox")

    async def detach(self) -> None:  # noqa: B027 (nothing to release by default)
        """Let go of a sandbox without removing anything (e.g. an :meth:`attach` whose
        connect failed): what was claimed or opened here is released; it runs on."""

    async def exact_refusal(self) -> str | None:
        """Why an exact snapshot of this sandbox cannot be taken; None if it can."""
        return (
            f"the {self.name or type(self).__name__} host cannot take exact snapshots "
            "(a runtime checkpoint of the whole memory)"
        )

    async def checkpoint(self) -> tuple[list[tuple[str, Path]], ConnectionInfo]:
        """Checkpoint the sandbox, which stops: the checkpoint's files on this host
        (name, path) and the kernel's connection as the sandbox sees it."""
        raise SnapshotError(await self.exact_refusal() or "exact snapshots are not offered")

    async def resume_checkpoint(self) -> ConnectionInfo:
        """Start the checkpointed sandbox again where it stopped."""
        raise SnapshotError(await self.exact_refusal() or "exact snapshots are not offered")

    def restore_checkpoint(
        self, info: ConnectionInfo, fill: Callable[[Path], Awaitable[None]]
    ) -> None:
        """Have :meth:`launch` start from a checkpoint that ``fill`` writes into the
        directory it is given, with the kernel's saved connection ``info``."""
        raise SnapshotError(
            f"the {self.name or type(self).__name__} host cannot restore exact snapshots"
        )

    async def post_launch(self) -> None:  # noqa: B027 (optional hook)
        """The client's attempt to connect to the kernel that starts now is over.

        Called after every (re)start, whether the client connected or not (a kernel
        that never came must not leave a way in): the place to take back what only the
        kernel's start needed (e.g. write access to a run directory).
        """

    @abc.abstractmethod
    async def poll(self) -> str | None:
        """None while the kernel runs, else a sentence saying why it does not.

        Called often (every few hundred ms while a cell runs and while connecting), so
        it must be cheap: a host may rate-limit its engine calls and rely on the
        supervisor's report of a kernel's end in between.
        """

    @abc.abstractmethod
    async def state(self) -> HostState:
        """Ask the engine now whether what runs the sandbox runs (never rate-limited)."""

    @abc.abstractmethod
    async def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the kernel process (not to the rest of the sandbox).

        Raises :class:`~kernel_sandbox.errors.KernelError` when there is no kernel to
        signal.
        """

    async def interrupt(self) -> None:
        """Interrupt the running cell as a Jupyter kernel with ``interrupt_mode: signal``."""
        await self.send_signal(signal.SIGINT)

    @abc.abstractmethod
    async def restart_kernel(self, *, kill_all: bool = False) -> ConnectionInfo:
        """End the kernel and start a fresh one in place: files are kept.

        With ``kill_all`` every process of the sandbox ends too (what shell commands
        left running).  Raises :class:`~kernel_sandbox.errors.KernelError` when it
        cannot (e.g. what runs the sandbox stopped); the caller then tries
        :meth:`restart_whole`.  The caller has closed its client first.
        """

    async def restart_whole(self) -> ConnectionInfo:
        """Restart everything that runs the sandbox; files may be lost.

        The default is jupyter_client's restart: ``kill(restart=True)``,
        ``cleanup(restart=True)``, then :meth:`launch` again.  Hosts that can restart
        their container in place (keeping its volumes) override it.
        """
        await self.kill(restart=True)
        await self.cleanup(restart=True)
        return await self.launch()

    @abc.abstractmethod
    async def kill(self, restart: bool = False) -> None:
        """Stop the kernel and what runs it now, without removing anything.

        ``restart`` is True when :meth:`launch` follows (a whole restart).
        """

    @abc.abstractmethod
    async def cleanup(self, restart: bool = False) -> None:
        """Release what :meth:`launch` made; safe twice and after a failed launch.

        ``restart=False`` (close) removes everything: the container, its volumes,
        host-side files.  ``restart=True`` keeps what the next :meth:`launch` of this
        same host reuses.
        """

    async def logs(self, tail: int) -> str:
        """The last ``tail`` lines the sandbox's main process wrote (for start errors)."""
        return ""

    def egress_refusals(self) -> list[Decision]:
        """Connections the host's egress proxy refused since the last call (``network=``
        "packages" or a list; see :mod:`kernel_sandbox.network`): its ``Decision`` records.
        A host without an egress proxy has none."""
        return []

    # -- beside the kernel ------------------------------------------------------------

    @abc.abstractmethod
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
        """Run a process beside the kernel as the sandbox user and wait for it.

        A busy or dead kernel never blocks it; this is also how files move (a write is
        ``cat`` reading ``stdin``, a read is ``head`` writing stdout), so every byte is
        handled by the sandbox user, never by root on a path the sandbox controls.
        With ``max_output_bytes``, stdout and stderr each keep only their head and tail
        within it (:class:`~kernel_sandbox.limits.HeadTail`), read as streams, so a
        process printing gigabytes never fills host memory.  ``stdin`` is fed to the
        process and then closed.  With ``deadline`` (seconds) the host stops waiting
        then and raises :class:`~kernel_sandbox.errors.FileOperationError`: a process
        the sandbox can stop or block must never hold the host.  Without it the caller
        bounds the time (its own ``timeout`` in argv).
        """

    async def exec_stream(
        self,
        argv: list[str],
        *,
        stdin: AsyncIterable[bytes] | None = None,
        stdout: Callable[[bytes], Awaitable[None]],
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        """:meth:`exec` with its input and output streamed: what a file transfer needs.

        ``stdin``'s chunks are fed to the process as they come (the caller bounds how
        many); every piece of stdout is awaited through ``stdout`` as it arrives (its
        back-pressure holds the process), so :attr:`ExecResult.stdout` is empty;
        stderr is kept within ``max_output_bytes``.  ``deadline`` bounds the whole call,
        a slow consumer included.  This default is *not* streamed: it gathers ``stdin``
        and hands stdout over at the end (hosts whose engine can stream override it).
        """
        data = None
        if stdin is not None:
            data = b"".join([chunk async for chunk in stdin])
        result = await self.exec(
            argv, stdin=data, max_output_bytes=max_output_bytes, deadline=deadline
        )
        if result.stdout:
            await stdout(result.stdout)
        return ExecResult(result.exit_code, b"", result.stderr, result.truncated_bytes)

    # -- the engine as a whole ------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    async def list_sandboxes(cls, labels: dict[str, str]) -> list[SandboxRecord]:
        """Every sandbox of this engine carrying all of ``labels``, running or not."""

    @classmethod
    async def gc(cls, *, remove_all: bool = False) -> list[Leftover]:
        """What this engine holds for sandboxes whose owner process is gone.

        With ``remove_all``, everything kernel_sandbox made, owner alive or not.
        Nothing is removed until the caller calls each :attr:`Leftover.remove`.
        """
        return []

    @classmethod
    async def remove_sandboxes(
        cls, labels: dict[str, str], *, keep: frozenset[str] = frozenset()
    ) -> int:
        """Remove every sandbox carrying all of ``labels`` with what it holds, except
        those whose sandbox id is in ``keep``; return how many were removed.

        One that cannot be removed is logged and skipped (it must not stop a server
        starting).  The default removes nothing and logs what it left.
        """
        left = [r for r in await cls.list_sandboxes(labels) if r.sandbox_id not in keep]
        if left:
            log.warning("%d sandboxes left on host %r: it cannot remove them", len(left), cls.name)
        return 0

    @classmethod
    def election(cls, name: str, identity: str, duration: int) -> Election | None:
        """An election among the processes that use this engine under ``name``, this
        one known as ``identity``, each holding lasting ``duration`` seconds (None: the
        engine has no such primitive; callers fall back to their own)."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.sandbox_id} {self.resource_id or '-'}>"
