"""shell_executor: run a shell command beside the kernel, as the sandbox user."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .base import MIN_TIMEOUT, PATH_MAX, OsText, Tool, ToolOptions, register_tool
from .results import ToolResult, capped_note
from .texts import limits_text, where_text

if TYPE_CHECKING:
    from ..protocols import SandboxLike

__all__ = ["ShellExecutor", "ShellExecutorOptions", "ShellParams"]

#: Exit status of ``docker exec`` when the process could not even start.
_CANNOT_START = 126
#: Longest single argument Linux passes to a program (MAX_ARG_STRLEN, with its NUL).
_MAX_ARG_BYTES = 128 * 1024 - 1


class ShellParams(BaseModel):
    """Arguments of shell_executor."""

    model_config = ConfigDict(extra="forbid")

    command: OsText = Field(description="A command for /bin/sh.")
    timeout: float | None = Field(
        default=None,
        ge=MIN_TIMEOUT,
        allow_inf_nan=False,
        description="Seconds before it is killed.",
    )
    cwd: OsText | None = Field(
        default=None, max_length=PATH_MAX, description="Directory to run in."
    )

    @field_validator("command", mode="before")
    @classmethod
    def _argv_as_line(cls, value: Any) -> Any:
        # ms-enclave's schema also takes an argument list (run as that program with
        # those arguments, as `docker exec` runs a list): the same as its shell-quoted line
        if isinstance(value, list):
            if not value or not all(isinstance(arg, str) for arg in value):
                raise ValueError("as a list, must be one or more strings (program, arguments)")
            return shlex.join(value)
        return value

    @field_validator("command")
    @classmethod
    def _fits_in_argv(cls, value: str) -> str:
        # longer commands fail in the kernel with "argument list too long" (E2BIG)
        size = len(value.encode())
        if size > _MAX_ARG_BYTES:
            raise ValueError(
                f"is {size:,} bytes long, more than the {_MAX_ARG_BYTES + 1:,} bytes a "
                "command line can hold; write the script to a file with file_operation "
                "and run it with `sh <file>`"
            )
        return value


class ShellExecutorOptions(ToolOptions):
    """``tools_config["shell_executor"]``."""

    timeout: float | None = Field(
        default=None, gt=0, description="Default timeout; the sandbox's `timeout` when unset."
    )
    max_timeout: float = Field(default=600.0, gt=0, description="Upper bound for `timeout`.")


@register_tool
class ShellExecutor(Tool):
    """A shell command per call; runs even while the Python kernel is busy."""

    name = "shell_executor"
    Params = ShellParams
    Options = ShellExecutorOptions
    options: ShellExecutorOptions

    def default_timeout(self, sandbox: SandboxLike) -> float:
        """The timeout used when the model gives none."""
        return min(self.options.timeout or sandbox.config.timeout, self.options.max_timeout)

    def describe(self, sandbox: SandboxLike) -> str:
        return (
            "Run a shell command (/bin/sh -c) in the sandbox as an unprivileged user and get "
            "its stdout, stderr and exit code. Each call is a fresh shell: `cd` and exported "
            "variables do not carry over (use `cwd`, or chain commands with &&), but files "
            "do, and they are shared with python_executor. "
            f"{where_text(sandbox)} "
            f"{limits_text(sandbox, self.default_timeout(sandbox), self.options.max_timeout)} "
            "On timeout the command and its children are killed. Output longer than "
            f"{self.options.max_output_chars} characters is cut in the middle."
        )

    def parameter_descriptions(self, sandbox: SandboxLike) -> dict[str, str]:
        return {
            "command": "The command line, run with /bin/sh -c (pipes and && work).",
            "timeout": (
                f"Seconds before the command is killed; null for the default "
                f"({self.default_timeout(sandbox):g} s, at most {self.options.max_timeout:g})."
            ),
            "cwd": (
                f"Directory to run in, absolute or relative to {sandbox.working_dir}; "
                "null for the working directory."
            ),
        }

    async def run(self, sandbox: SandboxLike, params: ShellParams) -> ToolResult:
        timeout = min(params.timeout or self.default_timeout(sandbox), self.options.max_timeout)
        result = await sandbox.run_shell(params.command, timeout=timeout, cwd=params.cwd)
        metadata: dict[str, Any] = {"exit_code": result.exit_code, "timed_out": result.timed_out}
        if result.truncated_bytes:
            metadata["truncated_bytes"] = result.truncated_bytes
        if params.timeout and params.timeout > self.options.max_timeout:
            metadata["timeout_capped_at"] = self.options.max_timeout
        if result.exit_code == _CANNOT_START and "chdir to cwd" in result.stdout + result.stderr:
            where = sandbox.resolve_path(params.cwd or ".")
            return ToolResult.failure(
                self.name,
                f"the directory {where} does not exist in the sandbox; create it first "
                "(mkdir -p) or pass an existing cwd",
                metadata=metadata,
            )
        parts = [result.stdout.rstrip("\n")]
        if result.stderr.strip():
            parts.append(f"[stderr]\n{result.stderr.strip(chr(10))}")
        output = capped_note("\n".join(p for p in parts if p), result.truncated_bytes)
        if result.timed_out:
            return ToolResult(
                status="timeout",
                tool_name=self.name,
                output=output,
                error=f"the command timed out after {timeout:g} s and was killed",
                metadata=metadata,
            )
        if result.exit_code != 0:
            return ToolResult(
                status="error",
                tool_name=self.name,
                output=output,
                error=f"the command exited with status {result.exit_code}",
                metadata=metadata,
            )
        return ToolResult(status="success", tool_name=self.name, output=output, metadata=metadata)
