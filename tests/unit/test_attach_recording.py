"""``kernel-sandbox attach`` records each cell of the console into the session notebook,
keeping at most ATTACH_CELL_OUTPUT_BYTES of its outputs (the console showed them all).

The recording shell is built on a stand-in for jupyter_console's shell class (the
console itself needs a terminal): it hands the recorder the messages a kernel sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_notebook

from kernel_sandbox.cli.attach import recording_shell
from kernel_sandbox.limits import ATTACH_CELL_OUTPUT_BYTES
from kernel_sandbox.notebook.cells import META_KEY

PIECE = 256 * 1024


class Console:
    """What the recording shell needs of jupyter_console's: outputs, each from here."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages

    def from_here(self, msg: dict[str, Any]) -> bool:
        return True

    def include_output(self, msg: dict[str, Any]) -> bool:
        return True

    def run_cell(self, cell: str, store_history: bool = True) -> None:
        for msg in self.messages:
            self.include_output(msg)  # type: ignore[attr-defined]


def _stream(i: int) -> dict[str, Any]:
    text = f"{i}" + "x" * (PIECE - 2) + "\n"
    return {"header": {"msg_type": "stream"}, "content": {"name": "stdout", "text": text}}


def test_a_cell_that_prints_megabytes_is_recorded_within_the_cap(tmp_path: Path) -> None:
    notebook = tmp_path / "session.ipynb"
    nbformat.write(new_notebook(), notebook)
    pieces = 4 * ATTACH_CELL_OUTPUT_BYTES // PIECE
    shell = recording_shell(Console, notebook)([_stream(i) for i in range(pieces)])
    shell.run_cell("for i in range(16): print(i, 'x' * 262142)")
    (cell,) = nbformat.read(notebook, as_version=4).cells
    kept = sum(len(o["text"]) for o in cell.outputs)
    assert 0 < kept <= ATTACH_CELL_OUTPUT_BYTES
    assert cell.metadata[META_KEY]["truncated_bytes"] > 2 * ATTACH_CELL_OUTPUT_BYTES
