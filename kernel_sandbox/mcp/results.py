"""Sandbox results as MCP tool results: text, PNG images, ``isError`` with the traceback.

The SDK turns an exception in a tool into a bare "Error executing tool" without the
traceback, so every tool returns its ``CallToolResult`` itself.
"""

from __future__ import annotations

from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent

from ..limits import MCP_MAX_TEXT_CHARS
from ..results import CommandResult, Execution, strip_ansi

__all__ = ["error_result", "execution_result", "shell_result", "text_result"]


def _cut(text: str) -> str:
    if len(text) <= MCP_MAX_TEXT_CHARS:
        return text
    half = MCP_MAX_TEXT_CHARS // 2
    return (
        f"{text[:half]}\n[... {len(text) - MCP_MAX_TEXT_CHARS} characters cut ...]\n{text[-half:]}"
    )


def text_result(text: str, *, error: bool = False) -> CallToolResult:
    """One text block."""
    return CallToolResult(content=[TextContent(type="text", text=_cut(text))], is_error=error)


def error_result(text: str) -> CallToolResult:
    """An ``isError`` result the model can read and act on."""
    return text_result(text, error=True)


def execution_result(execution: Execution) -> CallToolResult:
    """Text of the cell (with the whole traceback on error) and each PNG as an image."""
    text = execution.text
    shown = any(o["output_type"] == "error" for o in execution.outputs)  # in text already
    if execution.error is not None and execution.error.traceback and not shown:
        text = "\n".join([text, "Traceback:", *map(strip_ansi, execution.error.traceback)])
    content: list[ContentBlock] = [
        TextContent(type="text", text=_cut(text or f"[{execution.status}, no output]"))
    ]
    for output in execution.outputs:
        png = output.get("data", {}).get("image/png")
        if isinstance(png, str):
            content.append(ImageContent(type="image", data=png.strip(), mime_type="image/png"))
    return CallToolResult(content=content, is_error=execution.status != "ok")


def shell_result(result: CommandResult) -> CallToolResult:
    """stdout, stderr and the exit code; a non-zero exit or a timeout is an error."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr}")
    parts.append(f"[exit code {result.exit_code}{', timed out' if result.timed_out else ''}]")
    return text_result("\n".join(p for p in parts if p), error=not result.ok)
