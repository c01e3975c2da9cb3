"""The host's side of the supervisor's state directory: kernel ends in, "go ahead" out.

See :mod:`kernel_sandbox.kernel.supervisor` for the protocol.  Two places hold it:

* :class:`HostRunDir` (``ipc`` transport): the per-sandbox host directory that is
  bind-mounted into the container and holds the kernel's unix sockets.  It is on the
  host's disk, so the sandbox must not be able to store anything in it: it is open to
  the container user only while a new container binds the kernel's sockets (see
  ``BINDER`` in :mod:`~kernel_sandbox.kernel.connection`: they outlive kernel
  restarts), with the sticky bit so the host's files cannot be removed, and *sealed*
  (mode 0755, every entry that is not one of the sockets removed) as soon as the host
  is connected.  The status channel is a FIFO the host keeps open for reading:
  a kernel's end is a local, non-blocking read, and whatever is written into it sits
  in a pipe buffer of at most 64 KiB, never on disk.
* :class:`ContainerStateDir` (``tcp`` transport): a directory in the container's
  ``/tmp`` (bounded by ``disk_limit`` like the rest of the sandbox), read through
  the engine since nothing is shared with the host.

If the host user has the same uid as the container user, the container owns the run
directory and could make it writable again: :meth:`HostRunDir.seal` logs a warning
then (use the ``tcp`` transport or another host user to close that hole).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from abc import ABC, abstractmethod
from pathlib import Path

import docker

from ... import rundirs
from ...errors import KernelError, SandboxError
from ...kernel.supervisor import GO_PREFIX, STATUS_FILE, TCP_STATE_DIR, KernelEnd, parse_status
from ...limits import (
    STATUS_FIFO_READ_BYTES,
    STATUS_FILE_READ_BYTES,
    STATUS_FILE_READ_SECONDS,
    STATUS_LINE_BYTES,
)
from .exec import exec_process

__all__ = ["ContainerStateDir", "GuestStateDir", "HostRunDir", "StateDir"]

log = logging.getLogger(__name__)

# Only a regular file that is not a link is read, at most STATUS_FILE_READ_BYTES bytes, for at
# most STATUS_FILE_READ_SECONDS seconds (a link to /dev/zero or a FIFO swapped in after the test are
# cut by the byte cap and the time limit; the host's own deadline covers a stopped
# `timeout`).
_TCP_READ = (
    '[ -f "$1" ] && [ ! -L "$1" ] || exit 0; '
    f'exec timeout -s KILL "$2" head -c {STATUS_FILE_READ_BYTES} -- "$1"'
)
#: The run directory while a kernel binds its sockets: writable, but nobody removes or
#: renames what is not theirs (sticky).  Sealed, the container user may only look.
_OPEN_MODE, _SEALED_MODE = 0o1777, 0o755


class StateDir(ABC):
    """Which kernel the supervisor runs now, and how to hear of its end or start the next."""

    def __init__(self) -> None:
        #: The number of the kernel that runs now (the supervisor counts from 1).
        self.kernel = 1
        self._end: KernelEnd | None = None

    async def kernel_end(self) -> KernelEnd | None:
        """How the current kernel ended, or None while it runs."""
        if self._end is None:  # a report is read once: remember it
            self._end = await self._read_end()
        return self._end

    @abstractmethod
    async def _read_end(self) -> KernelEnd | None:
        """The supervisor's report of the current kernel's end, if it is there yet."""

    async def start_next(self) -> None:
        """Let the supervisor start the next kernel; call once its sockets are cleared."""
        await self._go(f"{GO_PREFIX}{self.kernel}")
        self.kernel += 1
        self._end = None

    @abstractmethod
    async def _go(self, name: str) -> None:
        """Create the file ``name`` in the state directory."""

    def open_for_kernel(self) -> None:  # noqa: B027 (nothing to do with tcp)
        """Let a new container bind the kernel's sockets (the old ones are removed)."""

    def seal(self) -> None:  # noqa: B027 (nothing to do with tcp)
        """The kernel is connected: take away what the sandbox should not have."""

    def container_restarted(self) -> None:
        """A new supervisor runs: its first kernel is number 1."""
        self.kernel = 1
        self._end = None

    def release(self) -> None:  # noqa: B027 (nothing to do for a guest)
        """Give up what this process holds on the sandbox (detach); the sandbox stays."""

    def close(self) -> None:
        """Release every host-side resource (the sandbox is being removed)."""
        self.release()


class HostRunDir(StateDir):
    """The ``ipc`` run directory on the host, sealed while a kernel is connected."""

    def __init__(self, path: Path, sockets: set[str]) -> None:
        """Make ``path`` (open for the first kernel) with its claim and status FIFO."""
        super().__init__()
        self.path = path
        self._sockets = sockets
        self._claim: int | None = None
        self._fifo: int | None = None
        self._pending = b""
        self._warned = False
        #: Entries of other kernels' (contexts') the host made here: kept by a seal.
        self.keep: set[str] = set()
        path.mkdir(mode=0o700)
        self._claim = rundirs.claim(path)  # gc: in use
        fifo = path / STATUS_FILE
        os.mkfifo(fifo)
        os.chmod(fifo, 0o622)  # the container user writes, only the host reads
        # A reader that never blocks, and is always there: the supervisor's writes
        # never block either (unless the sandbox filled the pipe; the next read frees it).
        self._fifo = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.chmod(path, _OPEN_MODE)

    @classmethod
    def adopt(cls, path: Path, sockets: set[str]) -> HostRunDir:
        """Take over the run directory a dead owner left (its kernel still running).

        Refused while another live process holds its claim: two owners would steal
        each other's reports and remove the directory under each other.  The status
        FIFO is opened for reading again (its old reader died with the old owner).
        """
        if path.is_symlink() or not path.is_dir() or path.parent != rundirs.runtime_root():
            raise KernelError(f"{path} is not a sandbox run directory of this user")
        if rundirs.is_claimed(path):
            raise KernelError(
                f"the sandbox's run directory {path} is held by a live process (its "
                "owner); attach as a guest, or stop that process first"
            )
        self = cls.__new__(cls)
        StateDir.__init__(self)
        self.path, self._sockets = path, sockets
        self._pending, self._warned = b"", False
        self.keep = set()
        self._claim = rundirs.claim(path)
        fifo = path / STATUS_FILE
        try:
            if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
                raise KernelError(f"{fifo} is not the supervisor's status FIFO")
            self._fifo = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            rundirs.release(self._claim)
            raise KernelError(f"cannot open the supervisor's status channel: {exc}") from exc
        except KernelError:
            rundirs.release(self._claim)
            raise
        self._read_lines()  # what was written while nobody read is about older kernels
        self._pending = b""
        return self

    async def _read_end(self) -> KernelEnd | None:
        return parse_status(self._read_lines().decode(errors="replace"), self.kernel)

    def _read_lines(self) -> bytes:
        """The complete lines written to the FIFO since the last read."""
        assert self._fifo is not None
        data, total = self._pending, 0
        while total < STATUS_FIFO_READ_BYTES:
            try:
                chunk = os.read(self._fifo, 65536)
            except BlockingIOError:
                break
            if not chunk:  # no writer at the moment
                break
            data += chunk
            total += len(chunk)
        cut = data.rfind(b"\n") + 1
        complete, self._pending = data[:cut], data[cut:]
        if len(self._pending) > STATUS_LINE_BYTES:
            self._pending = b""
        return complete

    async def _go(self, name: str) -> None:
        (self.path / name).touch()

    def open_for_kernel(self) -> None:
        """Clear the directory of everything but the host's files, then open it.

        Call only once no process of the old container is left (the engine waited for
        its end): anything put here from now on is the new binder's.  Whatever is in
        the sockets' place (a folder or link an old container planted) goes too.
        """
        self._sweep(keep_sockets=False)
        os.chmod(self.path, _OPEN_MODE)

    def seal(self) -> None:
        """Close the run directory to the container and remove anything it put there.

        What the container binds is a socket with one of the kernel's names; anything
        else (files, directories, links) was written by sandbox code while the
        directory was open, or is an old ``go-`` file.  Sealing is cheap and idempotent:
        it is done after every connect.
        """
        os.chmod(self.path, _SEALED_MODE)
        self._sweep(keep_sockets=True)

    def _sweep(self, keep_sockets: bool) -> None:
        """Remove every entry but the host's own (and the kernel's sockets if kept).

        Never follows a link: entries are judged by ``lstat`` and trees removed with
        ``rmtree``, which does not follow links either.
        """
        keep = {rundirs.OWNER_FILE, STATUS_FILE, *self.keep}
        for entry in os.scandir(self.path):
            if entry.name in keep:
                continue
            info = entry.stat(follow_symlinks=False)
            if keep_sockets and entry.name in self._sockets and stat.S_ISSOCK(info.st_mode):
                self._warn_if_owned(info.st_uid)
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def _warn_if_owned(self, uid: int) -> None:
        if uid == os.getuid() and not self._warned:
            self._warned = True
            log.warning(
                "the sandbox user has the same uid (%d) as this process, so sandbox code "
                "could make its run directory %s writable again and write to this host's "
                "disk; run as another user or use transport='tcp'",
                uid,
                self.path,
            )

    def container_restarted(self) -> None:
        super().container_restarted()
        self._read_lines()  # whatever the old container wrote is not about the new one
        self._pending = b""

    def release(self) -> None:
        """Close the status channel and give up the claim; the directory stays."""
        if self._fifo is not None:
            os.close(self._fifo)
            self._fifo = None
        if self._claim is not None:
            rundirs.release(self._claim)
            self._claim = None

    def close(self) -> None:
        if self._fifo is not None:
            os.close(self._fifo)
            self._fifo = None
        shutil.rmtree(self.path, ignore_errors=True)
        if self._claim is not None:
            rundirs.release(self._claim)
            self._claim = None


class GuestStateDir(StateDir):
    """A guest's view (``attach(own=False)``): the owner keeps the supervisor's channel.

    A guest reads no reports (they are the owner's; a FIFO hands each byte to one
    reader) and starts no kernel; the engine's state tells it of a dead container.
    """

    async def _read_end(self) -> KernelEnd | None:
        return None

    async def _go(self, name: str) -> None:
        raise KernelError("a guest attached to a sandbox cannot restart its kernel")


class ContainerStateDir(StateDir):
    """The ``tcp`` state directory in the container's ``/tmp``, read through the engine."""

    def __init__(self, api: docker.APIClient, container_id: str, user: str) -> None:
        super().__init__()
        self._api = api
        self._container_id = container_id
        self._user = user
        self._adoption: tuple[Path, int] | None = None

    @classmethod
    def adopt(
        cls, api: docker.APIClient, container_id: str, user: str, sandbox_id: str
    ) -> ContainerStateDir:
        """Take over a ``tcp`` sandbox a dead owner left, with a claim in the runtime root
        (see :func:`~kernel_sandbox.rundirs.adoption_dir`): gc keeps the container while
        it is held, and a second live adopter is refused, as with an ``ipc`` run directory.
        """
        path = rundirs.adoption_dir(sandbox_id)
        if path is None:
            raise KernelError(f"{sandbox_id!r} is not a sandbox id")
        path.mkdir(mode=0o700, exist_ok=True)
        if rundirs.is_claimed(path):
            raise KernelError(
                f"sandbox {sandbox_id} is held by a live process that adopted it; attach "
                "as a guest, or stop that process first"
            )
        self = cls(api, container_id, user)
        self._adoption = (path, rundirs.claim(path))
        return self

    def release(self) -> None:
        """Give up an adopter's claim, and its directory (nothing else holds it)."""
        if self._adoption is not None:
            path, fd = self._adoption
            self._adoption = None
            rundirs.release(fd)
            shutil.rmtree(path, ignore_errors=True)

    async def _read_end(self) -> KernelEnd | None:
        try:
            result = await exec_process(
                self._api,
                self._container_id,
                [
                    "sh",
                    "-c",
                    _TCP_READ,
                    "sh",
                    f"{TCP_STATE_DIR}/{STATUS_FILE}",
                    f"{STATUS_FILE_READ_SECONDS:g}",
                ],
                user=self._user,
                max_output_bytes=STATUS_FILE_READ_BYTES,
                deadline=STATUS_FILE_READ_SECONDS + 3,
            )
        except SandboxError:  # gone (the engine check says so), or stalled by the sandbox
            return None
        text = result.stdout.decode(errors="replace") if result.exit_code == 0 else ""
        return parse_status(text, self.kernel)

    async def _go(self, name: str) -> None:
        await exec_process(
            self._api, self._container_id, ["touch", f"{TCP_STATE_DIR}/{name}"], user=self._user
        )
