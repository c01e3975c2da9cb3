#!/bin/sh
# The sandbox's main process: runs the kernel and restarts it in place.
# The protocol is described in kernel_sandbox/kernel/supervisor.py; the file names
# "status" and "go-<n>" are STATUS_FILE and GO_PREFIX there.
#
# Usage: supervisor.sh STATE_DIR KERNEL_COMMAND...
#
# A status file and go files left by an earlier container run (the state directory may
# outlive it) are not this run's; a FIFO is the host's, which drains it when the
# container restarts.  `wait` returns early (128 + the signal) when a trapped signal
# arrives; then it is repeated, and returns the kernel's own status (the shell keeps it
# even when it reaped the kernel during the interrupted wait).  Every signal that came
# during a wait is noted ($sigs): several at once run their traps in the kernel's own
# order, not the sender's, so the one that ended `wait` need not be the last one.
# Termination signals are caught (a caught signal, unlike an ignored one, is reset for
# the kernel) and do nothing: sandbox code signalling PID 1 cannot end the container.
trap 'sigs="$sigs 1"' HUP
trap 'sigs="$sigs 2"' INT
trap 'sigs="$sigs 15"' TERM
trap 'sigs="$sigs 10"; kill -KILL -"$kernel" 2>/dev/null' USR1
trap 'sigs="$sigs 12"; all=1; kill -KILL -1 2>/dev/null' USR2
dir=$1
shift
mkdir -p "$dir"
[ -p "$dir/status" ] || rm -f "$dir/status" "$dir"/go-*
# Sets $kills, without a command substitution: the supervisor must not fork to report,
# since a fork bomb's dying group may still hold the process limit (gVisor).
oom_kills() {
    kills=0
    for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
        if [ -r "$f" ]; then
            while read -r key value; do
                if [ "$key" = oom_kill ]; then
                    kills=$value
                    return
                fi
            done <"$f"
        fi
    done
}
# Sets $now to the whole seconds since boot, without forking (gVisor has /proc/uptime too).
uptime_s() {
    now=0
    read -r now _ 2>/dev/null </proc/uptime
    now=${now%.*}
}
# Until no process that `kill -KILL $1` names is left (reaped), 3 s at most, on builtins
# only (see below: nothing may fork while the dying processes may hold the limit).
reap() {
    uptime_s
    end=$((now + 3))
    i=0
    while kill -KILL "$1" 2>/dev/null && [ "$now" -lt "$end" ] && [ "$i" -lt 200000 ]; do
        uptime_s
        i=$((i + 1))
    done
}
n=0
kernel=
all=
while :; do
    n=$((n + 1))
    oom_kills
    before=$kills
    setsid "$@" &
    kernel=$!
    code=
    while :; do
        sigs=
        last=$code
        wait "$kernel"
        code=$?
        # a repeated wait for a kernel whose own status was that of a signal that came
        # too knows no such child (127): the status is the one read before
        if [ -n "$last" ] && [ "$code" -eq 127 ] && [ -z "$sigs" ]; then
            code=$last
            break
        fi
        case " $sigs " in
        *" $((code - 128)) "*) ;; # ended by a trapped signal: wait again
        *) break ;;
        esac
    done
    # Until the group is gone (reaped), 2-3 s at most: its processes hold the process
    # limit until then, and gVisor reaps a large group slowly.  No `sleep` (nor anything
    # else that forks) while they may: a fork the limit refuses ends a POSIX sh ("Cannot
    # fork", status 2), and the container with it.  So this loop spins on builtins; the
    # group normally goes within milliseconds.  (The count stops it if the clock cannot
    # be read.)
    reap -"$kernel"
    # Everything was killed (the host's kill-all): until all of it is gone too, on the same
    # terms.  A shell's fork bomb beside the kernel holds the process limit until gVisor
    # has reaped it, and a kernel started before that cannot make its threads (seen: ZMQ's
    # "Resource temporarily unavailable", then SIGABRT, and the whole container restarted).
    if [ -n "$all" ]; then
        all=
        reap -1
    fi
    oom_kills
    printf '\n%s %s %s %s\n' "$n" "$code" "$before" "$kills" >"$dir/status"
    # (Polled, not spun on: a kill signal the host sent for a kernel that had ended
    # already may still be on its way through Docker's init, and must not meet the next.)
    until [ -e "$dir/go-$n" ]; do sleep 0.05; done
done
