"""Several server processes serving the same sandboxes (``kernel-sandbox serve --workers N``).

Any worker serves any sandbox.  What a worker needs to serve a sandbox another worker
made is never only in that worker's memory: the engine has the container and its labels
(the server's name, the owner's key id; the kernel's connection keys in its environment,
as adoption after a restart reads them), and the shared record directory has the rest::

    <record dir>/<key id>/<sandbox id>.ipynb   the session notebook; its metadata holds
                                               the sandbox's settings
    <record dir>/<key id>/<sandbox id>.lock    the sandbox's state file (below)
    <record dir>/<key id>/<sandbox id>.resume  taken by whoever resumes it when paused
    <record dir>/<key id>/<sandbox id>.turn    a FIFO: the worker keeping the notebook's
                                               writing turn hands it over when poked
    <record dir>/.reaper.lock                  whoever holds it reaps (one pass at a time)

The state file exists while the sandbox lives: a worker asked for a sandbox it does not
hold adopts it on demand when the file is under the caller's key directory (so another
key's sandbox is a 404 on every worker, as it is on one), and drops its cached copy when
the file is gone (deleted or reaped by another worker).  An exclusive ``flock`` on it is
held around every recorded call, from before the kernel runs it until the call holds
the notebook's writing turn (its cell is written under that turn, before any later
call's: replicas just after the answer; workers keep the turn while their calls come and
write behind, coalescing, until another worker wants it), so the notebook's cells follow
the calls' order
whichever worker ran them (the notebook's own writer rule,
:mod:`kernel_sandbox.notebook.shared`, keeps every cell of every writer).  The holder
writes its :func:`identity` into it and empties it before it lets go: a worker that
takes the lock and finds another's left knows a worker died mid-call, and interrupts
the call nobody waits for any more.  Each release rewrites the file, so its
mtime is when the sandbox was last used, the clock the reaper reads (a worker's own
``last_used`` only knows its own calls).  Its first line is the sandbox's *generation*,
drawn when it became live: a sandbox paused and resumed (or restored) is another
kernel under the same id, so a worker whose cached copy names another generation lets
it go and attaches to the new one (:func:`generation`).

Replicas (``serve --replica``: the pods of a Deployment, or servers on several hosts)
follow the same rules on a shared volume (an NFS-like ReadWriteMany volume keeps
``flock`` across hosts; a hostPath on one node does as the kernel's own).  Only the
reaper's election differs on Kubernetes: a ``coordination.k8s.io`` Lease
(:class:`kernel_sandbox.backends.kubernetes.lease.LeaseElection`), not the lock file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

from .. import rundirs
from ..errors import CapacityError, SandboxNotFoundError
from ..notebook.shared import turn_path

__all__ = [
    "REAPER_LOCK",
    "STATE_SUFFIX",
    "call_lock",
    "drop",
    "generation",
    "guest_claim",
    "holder",
    "holder_died",
    "identity",
    "idle_for",
    "is_live",
    "live_states",
    "locked_file",
    "mark_live",
    "reaper_turn",
    "resume_turn",
    "state_path",
]

#: Suffix of a sandbox's state file, beside its notebook.
STATE_SUFFIX = ".lock"
#: Suffix of the lock file a resume of a paused sandbox takes, beside its state file.
RESUME_SUFFIX = ".resume"
#: The reaper's lock file in the record directory.
REAPER_LOCK = ".reaper.lock"
_NAME = re.compile(r"[0-9A-Za-z_-]{1,64}")
#: Seconds between two tries of a busy call lock: first, then at most (doubling).
LOCK_POLL = (0.001, 0.02)
#: Bytes of a holder's identity read back from a state file.
_IDENTITY_BYTES = 256
#: Bytes of a state file's first line: its generation (16 hex digits) and a newline.
_GENERATION_BYTES = 17
_identities: dict[int, str] = {}
T = TypeVar("T")


def identity() -> str:
    """This process among every server process on every host: its host name (a pod's
    name), pid and a nonce drawn once per process (a container started again in the
    same pod has the same name and pid 1)."""
    pid = os.getpid()
    if pid not in _identities:  # per pid: a forked worker draws its own
        _identities[pid] = f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}"
    return _identities[pid]


def state_path(record_dir: Path, owner: str, sandbox_id: object) -> Path | None:
    """The state file of ``owner``'s sandbox ``sandbox_id``; None for an id that could
    not be a sandbox's (a path, say: ids come from clients)."""
    if not isinstance(sandbox_id, str) or not _NAME.fullmatch(sandbox_id):
        return None
    if not _NAME.fullmatch(owner):
        return None
    return record_dir / owner / f"{sandbox_id}{STATE_SUFFIX}"


def mark_live(path: Path) -> str:
    """The sandbox lives (call once its notebook's directory exists); returns its
    generation (the one it has already when its state file exists: a restart's)."""
    drawn = secrets.token_hex(_GENERATION_BYTES // 2)
    made = path.with_name(f".{path.name}.{drawn}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(made, flags, 0o600)
    try:
        try:
            os.write(fd, f"{drawn}\n".encode())
        finally:
            os.close(fd)
        os.link(made, path)  # whole or not at all, and never over another's
    except FileExistsError:
        return generation(path) or ""
    finally:
        os.unlink(made)
    return drawn


def _read(path: Path, read: Callable[[int], T], missing: T) -> T:
    """``read`` of the state file's descriptor; ``missing`` when the sandbox is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return missing
    try:
        return read(fd)
    finally:
        os.close(fd)


def generation(path: Path) -> str | None:
    """The generation of the sandbox's state file ("" in one without); None when it is
    gone."""
    return _read(path, lambda fd: _generation(fd).decode(), None)


def _generation(fd: int) -> bytes:
    head = os.pread(fd, _GENERATION_BYTES, 0)
    if len(head) == _GENERATION_BYTES and head.endswith(b"\n"):
        return head[:-1]
    return b""


def _holder_at(fd: int) -> int:
    """Where a holder's identity starts in the state file: after its generation."""
    return _GENERATION_BYTES if _generation(fd) else 0


def is_live(path: Path) -> bool:
    """Whether the sandbox still lives (no worker deleted it)."""
    return path.is_file()


def drop(path: Path) -> None:
    """The sandbox is gone: every worker's next request for it is a 404 (its notebook's
    turn FIFO goes too: :func:`~kernel_sandbox.notebook.shared.turn_path` maps the state
    file and the notebook, ``<sandbox id>.*``, to the same ``<sandbox id>.turn``)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(FileNotFoundError):
        turn_path(path).unlink()


def idle_for(path: Path, now: float | None = None) -> float | None:
    """Seconds since any worker last used the sandbox; None when it is gone."""
    try:
        return (now or time.time()) - path.stat().st_mtime
    except FileNotFoundError:
        return None


def live_states(record_dir: Path) -> list[tuple[str, str, Path]]:
    """Every living sandbox of the record directory: (key id, sandbox id, state file)."""
    found = []
    for path in record_dir.glob(f"*/*{STATE_SUFFIX}"):
        sid, owner = path.name.removesuffix(STATE_SUFFIX), path.parent.name
        if state_path(record_dir, owner, sid) == path:
            found.append((owner, sid, path))
    return found


def guest_claim(run_dir: str, sandbox_id: str) -> int | None:
    """Claim a sandbox this worker serves as a guest (beside the worker that made it), so
    ``kernel-sandbox gc`` keeps it should that worker die; pass the result to
    :func:`kernel_sandbox.rundirs.release`.  The claim is shared: every worker's holds."""
    path = Path(run_dir) if run_dir else rundirs.adoption_dir(sandbox_id)
    if path is None or path.parent != rundirs.runtime_root() or not path.is_dir():
        return None
    try:
        return rundirs.claim(path)
    except OSError:
        return None


@contextlib.asynccontextmanager
async def call_lock(path: Path, wait: float, *, block: bool = True) -> AsyncIterator[bool]:
    """Hold the sandbox's call lock for the block; yields whether the previous holder
    died while it held it (its call is still running in the kernel, unwaited for).

    The lock is polled, never waited for in a thread (a thread per waiting call would
    starve the executor the holder needs to write its cell).  Raises
    SandboxNotFoundError when the sandbox is gone (before or while waiting),
    CapacityError after ``wait`` seconds, or at once when ``block`` is false.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SandboxNotFoundError(f"sandbox {path.stem!r} is gone") from None
    try:
        busy = f"sandbox {path.stem} is busy with a call of another worker (for {wait:g}s)"
        await _flock(fd, wait if block else 0.0, busy + "; try again when it ends")
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                raise FileNotFoundError(path)
        except FileNotFoundError:  # deleted while we waited
            raise SandboxNotFoundError(f"sandbox {path.stem!r} is gone") from None
        at = _holder_at(fd)
        died = _left_by_dead_holder(fd, at)
        mine = identity().encode()
        os.pwrite(fd, mine, at)
        os.ftruncate(fd, at + len(mine))
        try:
            yield died
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, at)  # no call runs; the mtime says when it was last used
    finally:
        os.close(fd)


async def _flock(fd: int, wait: float, busy: str) -> None:
    """Take an exclusive flock on ``fd``, polling for ``wait`` seconds (0: one try);
    CapacityError(``busy``) when it stays taken."""
    deadline = time.monotonic() + wait
    delay = LOCK_POLL[0]
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() + delay > deadline:
                raise CapacityError(busy) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, LOCK_POLL[1])


@contextlib.asynccontextmanager
async def resume_turn(state: Path, wait: float) -> AsyncIterator[None]:
    """One process at a time brings a paused sandbox back (or finds it back already):
    an exclusive flock on ``<sandbox id>.resume`` beside its state file."""
    busy = f"sandbox {state.stem} is being resumed by another worker (for {wait:g}s)"
    async with locked_file(state.with_suffix(RESUME_SUFFIX), wait, busy):
        yield


@contextlib.asynccontextmanager
async def locked_file(path: Path, wait: float, busy: str) -> AsyncIterator[int]:
    """One process at a time: an exclusive flock on ``path`` (made 0600 if missing, never
    through a link) for the block, which gets its descriptor; CapacityError(``busy``)
    after ``wait`` seconds."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        await _flock(fd, wait, busy)
        yield fd
    finally:
        os.close(fd)


def _left_by_dead_holder(fd: int, at: int) -> bool:
    """Whether the (locked) state file names a holder that died mid-call: a live holder
    empties the file before it lets go (checking the pid would race: a killed worker is
    a zombie until it is reaped; and it could be another host's).  ``at``: where its
    identity starts (:func:`_holder_at`)."""
    holder = _holder(fd, at)
    return bool(holder) and holder != identity()


def _holder(fd: int, at: int) -> str:
    return os.pread(fd, _IDENTITY_BYTES, at).strip().decode(errors="replace")


def holder(path: Path) -> str:
    """The identity of the process in a call to the sandbox now, or of one that died in
    it ("" when none; also when the sandbox is gone)."""
    return _read(path, lambda fd: _holder(fd, _holder_at(fd)), "")


def holder_died(path: Path) -> bool:
    """Whether the sandbox's last call lost its worker mid-call (its cell may still be
    running, so a kernel adopted now would answer only when it ends: interrupt it).
    False while a call holds the lock, or when the sandbox is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # a call holds it: its holder lives
            return False
        return _left_by_dead_holder(fd, _holder_at(fd))
    finally:
        os.close(fd)


@contextlib.contextmanager
def reaper_turn(record_dir: Path) -> Iterator[bool]:
    """Whether this worker is the one that reaps now (held for the block)."""
    record_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(record_dir / REAPER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
