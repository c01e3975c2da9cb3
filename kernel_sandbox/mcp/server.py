"""The MCP tools, on the official SDK's ``MCPServer``: a thin layer over the sandbox API.

Tools: ``run_python`` (the kernel keeps state across calls), ``run_code`` (any language
of the image, in contexts: :mod:`.code`), ``create_context`` / ``list_contexts`` /
``restart_context`` / ``remove_context``, ``run_shell``, ``read_file``, ``write_file``,
``list_files``, ``restart_kernel``, and over HTTP
``create_sandbox`` / ``close_sandbox`` (a sandbox a client names by id across
session-less calls).  Every tool returns
its own ``CallToolResult``: plots come back as PNG ``ImageContent`` next to the text,
failures as ``isError`` results carrying the traceback or the reason.
"""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent

from ..errors import SandboxError
from .arguments import SandboxId, Timeout
from .code import CodeTools
from .results import error_result, execution_result, shell_result, text_result
from .sessions import NamedSandboxes, SandboxSource

__all__ = ["build_mcp_server"]

INSTRUCTIONS = (
    "A stateful Python sandbox: a persistent IPython kernel in an isolated container. "
    "Variables, imports and files persist between run_python calls. The working "
    "directory is /sandbox. Plots (matplotlib) come back as images."
)
LANGUAGES_NOTE = (
    " run_code runs the other languages the sandbox's image has (R, JavaScript, bash, ...), "
    "each in its own kernel (a context) with its own state, all sharing the files."
)

NAMED = (
    " To keep a sandbox of your own, call create_sandbox once and pass the sandbox_id it "
    "returns to every other tool; calls without one share your API key's default sandbox."
)


def build_mcp_server(source: SandboxSource, *, max_timeout: float = 600.0) -> MCPServer:
    """An MCP server whose tools run in the sandboxes ``source`` hands out."""
    named = isinstance(source, NamedSandboxes)
    mcp = MCPServer(
        "kernel-sandbox", instructions=INSTRUCTIONS + LANGUAGES_NOTE + (NAMED if named else "")
    )

    def clamp(timeout: float | None) -> float | None:
        return None if timeout is None or timeout <= 0 else min(timeout, max_timeout)

    async def guarded(ctx: Context, sandbox_id: str | None, call: Any) -> CallToolResult:
        try:
            async with source.sandbox(ctx, sandbox_id) as sandbox:
                result: CallToolResult = await call(sandbox)
                return result
        except (SandboxError, LookupError, OSError, ValueError) as exc:
            return error_result(f"{type(exc).__name__}: {exc}")

    @mcp.tool(description=f"Run Python code. {INSTRUCTIONS}")
    async def run_python(
        code: str, ctx: Context, timeout: Timeout = None, sandbox_id: SandboxId = None
    ) -> CallToolResult:
        async def call(sb: Any) -> CallToolResult:
            return execution_result(await sb.run_python(code, clamp(timeout)))

        return await guarded(ctx, sandbox_id, call)

    @mcp.tool(description="Run a shell command in the sandbox (as its user, beside the kernel).")
    async def run_shell(
        command: str,
        ctx: Context,
        timeout: Timeout = None,
        cwd: str | None = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        async def call(sb: Any) -> CallToolResult:
            return shell_result(await sb.run_shell(command, clamp(timeout), cwd=cwd))

        return await guarded(ctx, sandbox_id, call)

    @mcp.tool(description="Read a text file of the sandbox (relative to /sandbox).")
    async def read_file(path: str, ctx: Context, sandbox_id: SandboxId = None) -> CallToolResult:
        async def call(sb: Any) -> CallToolResult:
            return text_result(await sb.files.read_text(path))

        return await guarded(ctx, sandbox_id, call)

    @mcp.tool(description="Write (create or replace) a text file in the sandbox.")
    async def write_file(
        path: str, content: str, ctx: Context, sandbox_id: SandboxId = None
    ) -> CallToolResult:
        async def call(sb: Any) -> CallToolResult:
            await sb.files.write(path, content)
            return text_result(f"wrote {len(content.encode())} bytes to {path}")

        return await guarded(ctx, sandbox_id, call)

    @mcp.tool(description="List a directory of the sandbox.")
    async def list_files(
        ctx: Context, path: str = ".", sandbox_id: SandboxId = None
    ) -> CallToolResult:
        async def call(sb: Any) -> CallToolResult:
            rows = [f"{i.type:<9} {i.size:>10}  {i.name}" for i in await sb.files.list(path)]
            return text_result("\n".join(rows) or "(empty)")

        return await guarded(ctx, sandbox_id, call)

    @mcp.tool(
        description="Restart the sandbox's kernels (the Python kernel and every context): "
        "variables are lost, files are kept."
    )
    async def restart_kernel(ctx: Context, sandbox_id: SandboxId = None) -> CallToolResult:
        async def call(sb: Any) -> CallToolResult:
            await sb.restart()
            return text_result("the kernel was restarted; variables are gone, files kept")

        return await guarded(ctx, sandbox_id, call)

    code_tools = CodeTools(mcp, source, guarded, clamp)
    code_tools.add()
    mcp.middleware.append(code_tools.middleware())
    if isinstance(source, NamedSandboxes):
        _add_named_tools(mcp, source)
    return mcp


def _add_named_tools(mcp: MCPServer, source: NamedSandboxes) -> None:
    """``create_sandbox`` and ``close_sandbox``: state across session-less calls."""

    @mcp.tool(
        description="Start a new sandbox of your own and return its sandbox_id. Pass it to "
        "run_python and the other tools to keep your variables and files across calls; "
        "close_sandbox removes it (idle sandboxes are removed by the server too)."
    )
    async def create_sandbox(ctx: Context) -> CallToolResult:
        try:
            sandbox_id = await source.create(ctx)
        except (SandboxError, OSError, ValueError) as exc:
            return error_result(f"{type(exc).__name__}: {exc}")
        return CallToolResult(
            content=[TextContent(type="text", text=sandbox_id)],
            structured_content={"sandbox_id": sandbox_id},
        )

    @mcp.tool(description="Remove a sandbox create_sandbox made: its variables and files go.")
    async def close_sandbox(sandbox_id: str, ctx: Context) -> CallToolResult:
        try:
            await source.remove(ctx, sandbox_id)
        except (SandboxError, LookupError, OSError) as exc:
            return error_result(f"{type(exc).__name__}: {exc}")
        return text_result(f"sandbox {sandbox_id} was removed")
