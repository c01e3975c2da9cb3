"""Shell commands beside the kernel: each in its own process group, killed whole on timeout.

Commands run through the engine (``exec``) as the sandbox user, so a busy or dead
kernel never blocks them; their output is capped on the way in (head and tail).
"""

from __future__ import annotations

import asyncio
import time

from .backends.base import Backend
from .results import CommandResult

__all__ = ["run_command"]

#: GNU timeout's exit status when it stopped the command.
_TIMEOUT_EXIT = 124
# GNU timeout puts the command in a new process group and, when time runs out, sends
# SIGTERM to the group; it stops waiting (and never sends its -k SIGKILL) as soon as the
# command itself has died.  Group members that survive SIGTERM (bash blocks it while
# retrying a refused fork, as in a fork bomb) would go on filling the pids limit, so the
# group is SIGKILLed (atomic against forks) after a timeout.  On a normal end, background
# processes the command started are left running, as in any shell.
_SHELL_RUNNER = (
    'timeout -k 2 "$0" sh -c "$1" & wait $!; rc=$?; '
    "if [ $rc = 124 ] || [ $rc = 137 ]; then kill -KILL -$! 2>/dev/null; fi; exit $rc"
)


async def run_command(
    backend: Backend,
    container_id: str,
    command: str,
    *,
    timeout: float,
    user: str,
    workdir: str,
    env: dict[str, str] | None,
    max_output_bytes: int,
) -> CommandResult:
    """Run ``sh -c command`` in the container; a timeout is a result, never an exception."""
    argv = ["sh", "-c", _SHELL_RUNNER, f"{timeout:g}", command]
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(
            backend.exec(
                container_id,
                argv,
                user=user,
                workdir=workdir,
                environment=env,
                max_output_bytes=max_output_bytes,
            ),
            timeout + 15,
        )
    except TimeoutError:
        return CommandResult(-1, "", "the command did not end", True, time.monotonic() - started)
    duration = time.monotonic() - started
    timed_out = result.exit_code == _TIMEOUT_EXIT or (
        result.exit_code == 137 and duration >= timeout
    )
    stderr = result.stderr.decode(errors="replace")
    if timed_out:
        stderr += f"\n[command timed out after {timeout:g}s; its process group was killed]"
    return CommandResult(
        result.exit_code,
        result.stdout.decode(errors="replace"),
        stderr,
        timed_out,
        duration,
        result.truncated_bytes,
    )
