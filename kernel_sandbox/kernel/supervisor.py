"""The container's main process: a POSIX ``sh`` loop that runs the kernel and restarts it in place.

Restarting the whole container to get a fresh kernel would wipe every file on the
sandbox's RAM-backed storage, so the kernel is a child of this supervisor instead
(which runs behind Docker's init).  The protocol with the host, all through files in
the supervisor's state directory and one signal:

1. The supervisor starts the kernel in its own session (``setsid``), so one
   ``kill -KILL -<pgid>`` ends the kernel and every process it spawned.
2. When the kernel ends, the rest of its process group is killed and the file
   ``status`` is written: ``<exit status> <oom kills before> <oom kills after>``.
   The cgroup's OOM-kill counter tells an OOM kill apart from any other SIGKILL;
   Docker's ``OOMKilled`` flag cannot, it stays set for the container's life.
3. SIGUSR1 (sent to the container, forwarded by Docker's init) makes the supervisor
   kill the kernel's process group; the kernel's end is then reported as in 2.
4. The supervisor starts a new kernel only once the host removed ``status``: the host
   first learns why the kernel died and clears the dead kernel's sockets.

SIGTERM, SIGINT and SIGHUP are caught and ignored (a caught signal, unlike an ignored
one, is reset for the kernel), so user code signalling PID 1 cannot end the container.
The shell costs about 2 MB of memory per sandbox.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "KILL_SIGNAL",
    "STATUS_FILE",
    "SUPERVISOR",
    "TCP_STATE_DIR",
    "KernelEnd",
    "parse_status",
]

#: The file the supervisor writes when the kernel has ended, and the host removes.
STATUS_FILE = "status"
#: The supervisor's state directory with the tcp transport (no directory is shared with
#: the host then; with ``ipc`` it is the bind-mounted run directory).
TCP_STATE_DIR = "/tmp/kernel-sandbox"
#: Sent to the container's main process to kill the kernel's process group.
KILL_SIGNAL = "SIGUSR1"

# $1 is the state directory, the rest is the kernel's command.  A status left by an
# earlier container run (the state directory may outlive it) is not this kernel's.
# `wait` returns early (above 128) when a caught signal arrives, so it is repeated
# while the kernel lives.
SUPERVISOR = f"""\
trap : HUP INT TERM
trap 'kill -KILL -"$kernel" 2>/dev/null' USR1
dir=$1
shift
mkdir -p "$dir"
rm -f "$dir/{STATUS_FILE}"
oom_kills() {{
    for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
        if [ -r "$f" ]; then
            while read -r key value; do
                if [ "$key" = oom_kill ]; then echo "$value"; return; fi
            done <"$f"
        fi
    done
    echo 0
}}
while :; do
    before=$(oom_kills)
    setsid "$@" &
    kernel=$!
    while :; do
        wait "$kernel"
        code=$?
        kill -0 "$kernel" 2>/dev/null || break
    done
    kill -KILL -"$kernel" 2>/dev/null
    echo "$code $before $(oom_kills)" >"$dir/{STATUS_FILE}.new"
    mv -f "$dir/{STATUS_FILE}.new" "$dir/{STATUS_FILE}"
    while [ -e "$dir/{STATUS_FILE}" ]; do sleep 0.05; done
done
"""


class KernelEnd(NamedTuple):
    """How the kernel ended, as the supervisor reported it."""

    exit_code: int
    oom_killed: bool


def parse_status(text: str) -> KernelEnd | None:
    """The content of the status file, or None if it is not (yet) a complete report."""
    fields = text.split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        return None
    code, before, after = (int(f) for f in fields)
    return KernelEnd(code, after > before)
