"""The container's main process: a POSIX ``sh`` loop that runs the kernel and restarts it in place.

Restarting the whole container to get a fresh kernel would wipe every file on the
sandbox's RAM-backed storage, so the kernel is a child of this supervisor instead
(which runs behind Docker's init).  The protocol with the host, all through the
supervisor's state directory and one signal:

1. The supervisor numbers its kernels 1, 2, ... and starts each in its own session
   (``setsid``), so one ``kill -KILL -<pgid>`` ends the kernel and every process it
   spawned.
2. When kernel ``n`` ends, the rest of its process group is killed (and waited for,
   a few seconds at most) and the line
   ``<n> <exit status> <oom kills before> <oom kills after>`` is written to ``status``.
   The cgroup's OOM-kill counter tells an OOM kill apart from any other SIGKILL;
   Docker's ``OOMKilled`` flag cannot, it stays set for the container's life.
3. SIGUSR1 (sent to the container, forwarded by Docker's init) makes the supervisor
   kill the kernel's process group; the kernel's end is then reported as in 2.
4. The supervisor starts kernel ``n + 1`` only once the host created ``go-<n>``: the
   host first learns why the kernel died.  (With ``ipc`` every kernel listens on the
   same sockets, bound once per container and inherited through the supervisor.)

With the ``ipc`` transport ``status`` is a FIFO the host made and keeps open for
reading, so a report is a local read on the host and nothing is stored on its disk
(the state directory is the host's run directory, which the sandbox cannot write to,
see :mod:`kernel_sandbox.backends.docker.statedir`).  With ``tcp`` it is a plain file in the
container's ``/tmp``.  Sandbox code runs as the same user as the supervisor, so it can
write lines of its own to ``status``: the kernel number and the blank line before
each report keep them from being taken for another kernel's end, and the worst a
forged line does is restart the sandbox's own kernel.

Nothing forks between a kernel's end and its report (no command substitution, no
``sleep``: the wait for the group spins on builtins and ``/proc/uptime``):
right after a fork bomb's group is killed, its processes still hold the process limit
until they are reaped (seconds under gVisor), and a fork the limit refuses ends a POSIX
``sh`` ("Cannot fork", status 2), and with it the container.

SIGTERM, SIGINT and SIGHUP are caught and ignored (a caught signal, unlike an ignored
one, is reset for the kernel), so user code signalling PID 1 cannot end the container.
The shell costs about 2 MB of memory per sandbox.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from ..config import TCP_STATE_DIR  # no directory is shared with the host with tcp
from ..errors import KernelError
from ..limits import KILL_LIMIT
from .programs import program

__all__ = [
    "GO_PREFIX",
    "KILL_ALL_SIGNAL",
    "KILL_LIMIT",
    "KILL_SIGNAL",
    "STATUS_FILE",
    "SUPERVISOR",
    "TCP_STATE_DIR",
    "KernelEnd",
    "parse_status",
    "wait_for_kernel_end",
]

#: Where the supervisor reports each kernel's end (a FIFO with ``ipc``, else a file).
STATUS_FILE = "status"
#: ``go-<n>``, created by the host, lets the supervisor start the kernel after kernel n.
GO_PREFIX = "go-"
#: Sent to the container's main process to kill the kernel's process group.
KILL_SIGNAL = "SIGUSR1"
#: Sent to kill every process of the sandbox but the supervisor (and Docker's init):
#: an explicit restart also ends shell commands' leftovers, e.g. a backgrounded fork bomb.
KILL_ALL_SIGNAL = "SIGUSR2"

#: The supervisor's source (``programs/supervisor.sh``): ``sh -c SUPERVISOR name STATE_DIR
#: KERNEL_COMMAND...``.  It uses the names :data:`STATUS_FILE` and :data:`GO_PREFIX`.
SUPERVISOR = program("supervisor.sh")


class KernelEnd(NamedTuple):
    """How the kernel ended, as the supervisor reported it."""

    exit_code: int
    oom_killed: bool


def parse_status(text: str, kernel: int) -> KernelEnd | None:
    """The last report of kernel number ``kernel``'s end in ``text``, if there is one.

    Lines that are not complete reports of that kernel (unfinished, older kernels,
    anything sandbox code wrote) are skipped.
    """
    for line in reversed(text.split("\n")[:-1]):
        fields = line.split()
        if len(fields) == 4 and all(f.isdigit() for f in fields) and int(fields[0]) == kernel:
            code, before, after = (int(f) for f in fields[1:])
            return KernelEnd(code, after > before)
    return None


async def wait_for_kernel_end(
    kernel_end: Callable[[], Awaitable[KernelEnd | None]], poll: float
) -> KernelEnd:
    """Step 3 of the protocol, for any host: after the kill signal, wait for the report
    of the kernel's end (``kernel_end`` reads it, None while there is none; asked every
    ``poll`` seconds).  Raises :class:`KernelError` after :data:`KILL_LIMIT` seconds."""
    deadline = time.monotonic() + KILL_LIMIT
    while (end := await kernel_end()) is None:
        if time.monotonic() > deadline:
            raise KernelError(
                f"the supervisor did not report the kernel's end within {KILL_LIMIT:g}s"
            )
        await asyncio.sleep(poll)
    return end
