"""The MCP tools for every language of the image: ``run_code`` and the context tools.

``run_code`` takes ``code``, ``language`` and ``context``.  Its ``language`` is an enum
of the languages the sandbox's image holds (its Jupyter kernelspecs, as
:meth:`~kernel_sandbox.sandbox.AsyncSandbox.languages` lists them), which the server
learns from a sandbox: the first ``tools/list`` asks the sandbox the caller would use
(made then instead of at the first call) and the tool is registered again with the enum
and a description naming those languages.  Every sandbox of one MCP server comes from
the same image, so that is asked once.  Until then (or if it cannot be asked) the
argument is any string and a language the image lacks comes back as an error naming
the ones it has.

``create_context``, ``list_contexts``, ``restart_context`` and ``remove_context`` are
the sandbox's contexts: kernels beside its own, each with its own state, sharing its
files.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from ..contexts import Context as SandboxContext
from ..errors import SandboxError
from ..limits import MAX_CODE_CHARS
from ..tools.code import PACKAGES
from .arguments import SandboxId, Timeout
from .results import execution_result, text_result
from .sessions import SandboxSource

__all__ = ["CodeTools", "describe_run_code"]

#: Runs ``call(sandbox)`` in the sandbox of ``(ctx, sandbox_id)``, failures as error results.
Guarded = Callable[..., Awaitable[CallToolResult]]

ContextId = Annotated[
    str | None,
    Field(
        max_length=64,
        description="A context's id (create_context returned it; 'default' is the sandbox's "
        "own kernel). Default: the first context of `language`.",
    ),
]
ContextIdRequired = Annotated[str, Field(max_length=64, description="A context's id.")]
Cwd = Annotated[
    str | None,
    Field(max_length=4096, description="Where the kernel starts (relative to /sandbox)."),
]


def describe_run_code(languages: list[str] | None) -> str:
    """What ``run_code`` tells the model: state per context, and what each language has."""
    if languages:
        offered = "; ".join(f"{lang}: {PACKAGES.get(lang, 'its kernel')}" for lang in languages)
        which = f"in one of the languages this sandbox has: {', '.join(languages)} ({offered})"
    else:
        which = "in a language the sandbox's image has a kernel for (python, r, javascript, bash)"
    return (
        f"Run code in a persistent Jupyter kernel of the sandbox, {which}. State (variables, "
        "imports, functions) is kept per context, like notebook cells: calls naming the same "
        "language run in that language's first context (made on first use), and "
        "create_context makes another with a fresh state, used by passing its id as "
        "`context`. Every context shares the sandbox's files (working directory /sandbox), "
        "so one language reads what another wrote. Errors come back as errors with the "
        "kernel's traceback; on timeout the code is interrupted and the state kept. "
        "Images (plots) come back as PNG."
    )


def _language_arg(languages: list[str] | None) -> Any:
    """The annotation of ``language``: an enum of ``languages`` once they are known."""
    if languages:
        enum: dict[str, Any] = {"enum": list(languages)}
        name: Any = Annotated[str, Field(max_length=64, json_schema_extra=enum)]
        told = f"One of: {', '.join(languages)}."
    else:
        name = Annotated[str, Field(max_length=64)]
        told = "python, r, javascript, typescript or bash (what the image has)."
    return Annotated[
        name | None,
        Field(description=f"{told} Default: the context's, else the sandbox's own kernel."),
    ]


def _context_text(context: SandboxContext) -> str:
    return f"{context.id}  {context.language} (kernel {context.kernel}), cwd {context.cwd}"


def _context_result(context: SandboxContext, what: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{what} {_context_text(context)}")],
        structured_content={
            "context_id": context.id,
            "language": context.language,
            "kernel": context.kernel,
            "cwd": context.cwd,
        },
    )


class CodeTools:
    """``run_code`` and the context tools of one MCP server, and the languages it learnt."""

    def __init__(
        self,
        mcp: MCPServer,
        source: SandboxSource,
        guarded: Guarded,
        clamp: Callable[[float | None], float | None],
    ) -> None:
        self.mcp = mcp
        self.source = source
        self.guarded = guarded
        self.clamp = clamp
        #: The image's languages, once a sandbox was asked (None before).
        self.languages: list[str] | None = None
        self._learning = asyncio.Lock()

    def add(self) -> None:
        """Register every tool (``run_code`` without its enum until :meth:`learn`)."""
        self._add_run_code()
        self._add_context_tools()

    async def learn(self, ctx: Context) -> None:
        """Ask the caller's sandbox which languages its image has (once per server) and
        register ``run_code`` again with them; a failure leaves it as it was.  A call
        that comes while another caller's sandbox is asked does not wait for it (over
        HTTP that is another key's): it lists ``run_code`` without the enum."""
        if self._learning.locked():
            return
        async with self._learning:
            if self.languages is not None:
                return
            with contextlib.suppress(SandboxError, LookupError, OSError, ValueError):
                async with self.source.sandbox(ctx, None) as sandbox:
                    self.languages = await sandbox.languages()
            if self.languages:
                self.mcp.remove_tool("run_code")
                self._add_run_code()

    def middleware(self) -> Any:
        """An SDK middleware that learns the languages before the first ``tools/list``."""

        async def languages_first(rctx: Any, call_next: Any) -> Any:
            if rctx.method == "tools/list" and self.languages is None:
                await self.learn(Context(request_context=rctx, mcp_server=self.mcp))
            return await call_next(rctx)

        return languages_first

    def _add_run_code(self) -> None:
        guarded, clamp = self.guarded, self.clamp

        async def run_code(
            code: Annotated[str, Field(max_length=MAX_CODE_CHARS)],
            ctx: Context,
            language: str | None = None,
            context: ContextId = None,
            timeout: Timeout = None,
            sandbox_id: SandboxId = None,
        ) -> CallToolResult:
            async def call(sb: Any) -> CallToolResult:
                ran = await sb.run_code(code, language, context=context, timeout=clamp(timeout))
                return execution_result(ran)

            result: CallToolResult = await guarded(ctx, sandbox_id, call)
            return result

        run_code.__annotations__["language"] = _language_arg(self.languages)
        self.mcp.add_tool(run_code, description=describe_run_code(self.languages))

    def _add_context_tools(self) -> None:
        mcp, guarded = self.mcp, self.guarded

        @mcp.tool(
            description="Start another kernel (a context) in the sandbox: its own variables, "
            "the sandbox's files. Returns its context_id for run_code's `context`. A language "
            "the image lacks is an error naming the ones it has."
        )
        async def create_context(
            language: Annotated[str, Field(max_length=64, description="e.g. python, r.")],
            ctx: Context,
            cwd: Cwd = None,
            sandbox_id: SandboxId = None,
        ) -> CallToolResult:
            async def call(sb: Any) -> CallToolResult:
                return _context_result(await sb.create_context(language, cwd=cwd), "created")

            result: CallToolResult = await guarded(ctx, sandbox_id, call)
            return result

        @mcp.tool(description="List the sandbox's contexts: id, language, kernel, cwd.")
        async def list_contexts(ctx: Context, sandbox_id: SandboxId = None) -> CallToolResult:
            async def call(sb: Any) -> CallToolResult:
                return text_result("\n".join(_context_text(c) for c in sb.list_contexts()))

            result: CallToolResult = await guarded(ctx, sandbox_id, call)
            return result

        @mcp.tool(
            description="Restart one context's kernel: its variables are lost; files and the "
            "other contexts are kept ('default' restarts every kernel, as restart_kernel)."
        )
        async def restart_context(
            context_id: ContextIdRequired, ctx: Context, sandbox_id: SandboxId = None
        ) -> CallToolResult:
            async def call(sb: Any) -> CallToolResult:
                await sb.restart_context(context_id)
                return text_result(f"context {context_id} was restarted; its variables are gone")

            result: CallToolResult = await guarded(ctx, sandbox_id, call)
            return result

        @mcp.tool(
            description="End a context's kernel and forget it (its variables go, files stay; "
            "the default context cannot be removed)."
        )
        async def remove_context(
            context_id: ContextIdRequired, ctx: Context, sandbox_id: SandboxId = None
        ) -> CallToolResult:
            async def call(sb: Any) -> CallToolResult:
                await sb.remove_context(context_id)
                return text_result(f"context {context_id} was removed")

            result: CallToolResult = await guarded(ctx, sandbox_id, call)
            return result
