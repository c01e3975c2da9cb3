"""An MCP tool result carries bounded text, whatever the sandbox printed: its ends and a
note of how much was cut (the model reads the tail, where errors and results are)."""

from __future__ import annotations

from mcp.types import TextContent

from kernel_sandbox.limits import MCP_MAX_TEXT_CHARS
from kernel_sandbox.mcp.results import execution_result, shell_result
from kernel_sandbox.results import CommandResult, Execution


def _text(block: object) -> str:
    assert isinstance(block, TextContent)
    return block.text


def test_a_flood_of_output_is_cut_to_its_ends_in_every_result() -> None:
    flood = "head\n" + "x" * (10 * MCP_MAX_TEXT_CHARS) + "\ntail"
    stream = {"output_type": "stream", "name": "stdout", "text": flood}
    cell = execution_result(Execution(status="ok", execution_count=1, outputs=[stream]))  # type: ignore[list-item]
    shell = shell_result(CommandResult(exit_code=0, stdout=flood, stderr=""))
    for result in (cell, shell):
        text = _text(result.content[0])
        assert len(text) <= MCP_MAX_TEXT_CHARS + 100
        assert text.startswith("head\n") and "characters cut" in text
    assert _text(cell.content[0]).endswith("\ntail")
    assert _text(shell.content[0]).endswith("[exit code 0]")
