#!/bin/sh
# Runs one shell command beside the kernel: sh -c shell_runner.sh TIMEOUT COMMAND
# (so TIMEOUT is $0 and COMMAND is $1).
#
# GNU timeout puts the command in a new process group and, when time runs out, sends
# SIGTERM to the group; it stops waiting (and never sends its -k SIGKILL) as soon as the
# command itself has died.  Group members that survive SIGTERM (bash blocks it while
# retrying a refused fork, as in a fork bomb) would go on filling the pids limit, so the
# group is SIGKILLed (atomic against forks) after a timeout.  On a normal end, background
# processes the command started are left running, as in any shell.
timeout -k 2 "$0" sh -c "$1" &
wait $!
rc=$?
if [ $rc = 124 ] || [ $rc = 137 ]; then kill -KILL -$! 2>/dev/null; fi
exit $rc
