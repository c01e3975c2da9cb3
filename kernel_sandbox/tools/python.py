"""python_executor: run code in the sandbox's persistent IPython kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..limits import MAX_CODE_CHARS
from .base import MIN_TIMEOUT, Text, Tool, ToolOptions, register_tool
from .results import ToolResult, capped_note, render_outputs
from .texts import limits_text, where_text

if TYPE_CHECKING:
    from ..protocols import SandboxLike
    from ..results import Execution

__all__ = ["MAX_CODE_CHARS", "PythonExecutor", "PythonExecutorOptions", "PythonParams"]


class PythonParams(BaseModel):
    """Arguments of python_executor."""

    model_config = ConfigDict(extra="forbid")

    code: Text = Field(
        max_length=MAX_CODE_CHARS, description="Python code to run, as in a Jupyter cell."
    )
    timeout: float | None = Field(
        default=None,
        ge=MIN_TIMEOUT,
        allow_inf_nan=False,
        description="Seconds before the code is interrupted.",
    )


class PythonExecutorOptions(ToolOptions):
    """``tools_config["python_executor"]``."""

    timeout: float | None = Field(
        default=None, gt=0, description="Default timeout; the sandbox's `timeout` when unset."
    )
    max_timeout: float = Field(default=600.0, gt=0, description="Upper bound for `timeout`.")


@register_tool
class PythonExecutor(Tool):
    """Stateful Python: one kernel per sandbox, variables survive between calls."""

    name = "python_executor"
    Params = PythonParams
    Options = PythonExecutorOptions
    options: PythonExecutorOptions

    def default_timeout(self, sandbox: SandboxLike) -> float:
        """The timeout used when the model gives none."""
        return min(self.options.timeout or sandbox.config.timeout, self.options.max_timeout)

    def describe(self, sandbox: SandboxLike) -> str:
        return (
            "Run Python code in a persistent IPython kernel inside an isolated sandbox. "
            "State persists between calls like notebook cells: variables, imports and "
            "functions defined earlier are still there, so build on previous results "
            "instead of recomputing them. The value of the last expression is shown (as in "
            "Jupyter) together with printed output; matplotlib figures and other images are "
            "captured and named in the result, e.g. [image/png #1, 20.1 KB]. Errors come "
            "back with their traceback so you can fix the code and call again. "
            f"{where_text(sandbox)} "
            f"{limits_text(sandbox, self.default_timeout(sandbox), self.options.max_timeout)} "
            "On timeout the code is interrupted and the variables are kept. "
            f"Output longer than {self.options.max_output_chars} characters is cut in the "
            "middle: print summaries rather than whole datasets."
        )

    def parameter_descriptions(self, sandbox: SandboxLike) -> dict[str, str]:
        return {
            "code": "Python code to run, as in a Jupyter cell (IPython magics work too).",
            "timeout": (
                f"Seconds before the code is interrupted; null for the default "
                f"({self.default_timeout(sandbox):g} s, at most {self.options.max_timeout:g})."
            ),
        }

    async def run(self, sandbox: SandboxLike, params: PythonParams) -> ToolResult:
        timeout = min(params.timeout or self.default_timeout(sandbox), self.options.max_timeout)
        execution = await sandbox.run_python(params.code, timeout=timeout)
        return self.result(execution, params.timeout)

    def result(self, execution: Execution, asked_timeout: float | None) -> ToolResult:
        """The tool's answer for ``execution`` (the timeout the model asked for, if any)."""
        text, artifacts = render_outputs(execution.outputs)
        text = capped_note(text, execution.truncated_bytes)
        if execution.message:
            text = f"{text}\n[{execution.message}]" if text else f"[{execution.message}]"
        error: str | None = None
        if execution.status == "ok":
            status = "success"
        elif execution.status == "error":
            status = "error"
            error = execution.error.summary if execution.error else "the code raised an error"
        elif execution.status == "timeout":
            status = "timeout"
            error = execution.message
        else:
            status = "error"
            error = execution.message or "the kernel died"
        metadata: dict[str, Any] = {
            "execution_count": execution.execution_count,
            "kernel_status": execution.status,
            "state_lost": execution.state_lost,
        }
        if execution.truncated_bytes:
            metadata["truncated_bytes"] = execution.truncated_bytes
        if asked_timeout and asked_timeout > self.options.max_timeout:
            metadata["timeout_capped_at"] = self.options.max_timeout
        return ToolResult(
            status=status,  # type: ignore[arg-type]
            tool_name=self.name,
            output=text,
            error=error,
            metadata=metadata,
            artifacts=artifacts,
            outputs=execution.outputs,
        )
