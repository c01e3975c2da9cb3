"""The sandbox's judgement of one request: what the kernel said → an :class:`Execution`.

The kernel layer reports what happened (:class:`~kernel_sandbox.kernel.client.RawExecution`:
finished, interrupted, stuck or died, with the outputs and the reply); this module
decides what the caller is told: the status, the error the outputs show, and the
sentence that explains a timeout or a lost kernel.  It is pure, so the sandbox's only
part is the restart a stuck or dead kernel needs (its outcome ends the message).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .kernel.client import RawExecution
from .results import Execution, ExecutionError, ExecutionStatus, strip_ansi

__all__ = ["judge"]


def judge(raw: RawExecution, timeout: float, duration: float) -> Execution:
    """The :class:`Execution` of ``raw``, a request given ``timeout`` seconds that took
    ``duration``.  A stuck or dead kernel gives ``state_lost=True`` and a message saying
    why; the caller restarts the kernel and adds what that did."""
    execution = _verdict(raw, timeout, duration)
    if raw.truncated_bytes:
        execution = dataclasses.replace(execution, truncated_bytes=raw.truncated_bytes)
    if raw.display_ids or raw.display_updates:
        execution = dataclasses.replace(
            execution, display_ids=raw.display_ids, display_updates=raw.display_updates
        )
    return execution


def _verdict(raw: RawExecution, timeout: float, duration: float) -> Execution:
    error = error_of(raw.outputs)
    count = raw.reply.get("execution_count")
    if raw.outcome == "finished":
        status: ExecutionStatus = "error" if error or raw.reply.get("status") == "error" else "ok"
        if status == "error" and error is None:  # reply-only error (e.g. aborted)
            c = raw.reply
            error = ExecutionError(c.get("ename", "Error"), c.get("evalue", ""), [])
        return Execution(status, raw.outputs, count, error, duration)
    if raw.outcome == "interrupted":
        message = (
            f"execution timed out after {timeout:g}s and was interrupted; "
            "the kernel and its variables are kept"
        )
        return Execution("timeout", raw.outputs, count, error, duration, message=message)
    if raw.outcome == "stuck":
        why = f"execution timed out after {timeout:g}s and did not stop when interrupted"
        status = "timeout"
    else:
        why = raw.death_reason
        status = "kernel_died"
    return Execution(status, raw.outputs, count, error, duration, state_lost=True, message=why)


def error_of(outputs: list[dict[str, Any]]) -> ExecutionError | None:
    """The last error output as an :class:`ExecutionError` (ANSI colours removed)."""
    for out in reversed(outputs):
        if out["output_type"] == "error":
            tb = [strip_ansi(line) for line in out.get("traceback", [])]
            return ExecutionError(out["ename"], out["evalue"], tb)
    return None
