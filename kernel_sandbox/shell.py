"""Shell commands beside the kernel: each in its own process group, killed whole on timeout.

Commands run through the kernel host (``exec``) as the sandbox user, so a busy or dead
kernel never blocks them; their output is capped on the way in (head and tail).
"""

from __future__ import annotations

import asyncio
import time

from .backends.base import KernelHost
from .kernel.programs import program
from .results import CommandResult

__all__ = ["run_command"]

#: GNU timeout's exit status when it stopped the command.
_TIMEOUT_EXIT = 124
#: ``sh -c _SHELL_RUNNER TIMEOUT COMMAND``: the command in its own process group, the
#: group killed whole after a timeout (``programs/shell_runner.sh``).
_SHELL_RUNNER = program("shell_runner.sh")


async def run_command(
    host: KernelHost,
    command: str,
    *,
    timeout: float,
    workdir: str,
    env: dict[str, str] | None,
    max_output_bytes: int,
) -> CommandResult:
    """Run ``sh -c command`` in the sandbox; a timeout is a result, never an exception."""
    argv = ["sh", "-c", _SHELL_RUNNER, f"{timeout:g}", command]
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(
            host.exec(
                argv,
                workdir=workdir,
                env=env,
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
