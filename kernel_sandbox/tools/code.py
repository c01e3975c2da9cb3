"""code_executor: run code in any language the sandbox's image has a kernel for.

One tool with a ``language`` argument rather than a tool per language: the model sees
the languages this sandbox holds (its image's kernelspecs) in the description, each
kernel keeps its own state, and they share the sandbox's files (write a CSV in python,
read it in R).  Opt-in (``tools_config={"code_executor": {}}``); ms-enclave's
``python_executor`` is unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from ..limits import MAX_CODE_CHARS
from .base import MIN_TIMEOUT, Text, register_tool
from .python import PythonExecutor
from .results import ToolResult

if TYPE_CHECKING:
    from ..protocols import SandboxLike

__all__ = ["PACKAGES", "CodeExecutor", "CodeParams"]

#: What each language's kernel in our images comes with (told to the model).
PACKAGES = {
    "python": "numpy, pandas, matplotlib, scipy, scikit-learn, seaborn, statsmodels "
    "(kernel-sandbox:datascience and :polyglot)",
    "r": "ggplot2, dplyr, tidyr, readr, data.table; plots come back as PNG",
    "javascript": "Deno (JavaScript and TypeScript, top-level await, Deno.* APIs); "
    "Deno.jupyter.display(...) shows HTML or images; npm: imports only where the "
    "sandbox's network policy reaches a registry",
    "typescript": "Deno, as for javascript",
    "bash": "a persistent bash session (variables and the working directory persist)",
}


class CodeParams(BaseModel):
    """Arguments of code_executor."""

    model_config = ConfigDict(extra="forbid")

    code: Text = Field(max_length=MAX_CODE_CHARS, description="Code to run, as in a cell.")
    language: str = Field(default="python", max_length=64, description="The language of the code.")
    timeout: float | None = Field(
        default=None,
        ge=MIN_TIMEOUT,
        allow_inf_nan=False,
        description="Seconds before the code is interrupted.",
    )


def _languages(sandbox: SandboxLike) -> list[str]:
    """The image's languages when the sandbox knows them already (no call made here)."""
    known = getattr(sandbox, "known_languages", None)
    return (known() if callable(known) else None) or ["python"]


@register_tool
class CodeExecutor(PythonExecutor):
    """Stateful code in every language of the image: a kernel per language."""

    name = "code_executor"
    Params = CodeParams  # type: ignore[assignment]

    def describe(self, sandbox: SandboxLike) -> str:
        languages = _languages(sandbox)
        offered = "; ".join(f"{lang}: {PACKAGES.get(lang, 'its kernel')}" for lang in languages)
        return (
            "Run code in a persistent Jupyter kernel inside an isolated sandbox, in one of "
            f"these languages: {', '.join(languages)}. Each language has its own kernel "
            "whose state persists between calls like notebook cells (variables, imports, "
            "functions), and all of them share the sandbox's files, so one language can "
            f"read what another wrote. What each has: {offered}. "
            + super().describe(sandbox).split(". ", 1)[1]
        )

    def parameter_descriptions(self, sandbox: SandboxLike) -> dict[str, str]:
        languages = _languages(sandbox)
        return {
            **super().parameter_descriptions(sandbox),
            "code": "Code to run, as in a Jupyter cell of the language.",
            "language": f"One of: {', '.join(languages)}.",
        }

    async def run(self, sandbox: SandboxLike, params: CodeParams) -> ToolResult:  # type: ignore[override]
        timeout = min(params.timeout or self.default_timeout(sandbox), self.options.max_timeout)
        execution = await sandbox.run_code(params.code, params.language, timeout=timeout)
        return self.result(execution, params.timeout)
