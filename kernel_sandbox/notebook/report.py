"""What a replay found, per cell and in all: the values :func:`~.replay.replay` returns.

The same facts are written into the replayed notebook, so the notebook alone is the
report: ``cell.metadata["kernel_sandbox"]["replay"]`` holds the verdict, the compact
diff and the recorded outputs; the notebook's ``metadata["kernel_sandbox"]["replay"]``
holds the summary, image, language and kernel versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nbformat import NotebookNode

from ..results import strip_ansi

__all__ = ["VERDICTS", "CellReplay", "ReplayReport", "Verdict", "failing_line"]

Verdict = Literal["same", "differs", "size only", "new error", "ignored", "skipped", "unrecorded"]
#: Every verdict, in the order a summary lists them.
VERDICTS: tuple[Verdict, ...] = (
    "same",
    "differs",
    "size only",
    "new error",
    "ignored",
    "skipped",
    "unrecorded",
)
_ARROW = re.compile(r"^-+>\s*(?:\d+\s)?(.*)$")
_CELL_FRAME = re.compile(r"Cell In\s*\[|<ipython-input-|/tmp/ipykernel_\d+/")


def failing_line(traceback: list[str]) -> str:
    """The line of the cell that raised, from an IPython traceback (``----> 3 1/0``).

    The cell's own frame (``Cell In[n]``, or ``<ipython-input-n>`` in older IPython)
    of the last exception in a chain wins; else the first arrowed line.
    """
    cell_line = first_line = ""
    for entry in traceback:
        text = strip_ansi(entry)
        arrowed = ""
        for line in text.splitlines():
            match = _ARROW.match(line.strip())
            if match and match.group(1).strip():
                arrowed = match.group(1).strip()
                break
        first_line = first_line or arrowed
        if arrowed and _CELL_FRAME.search(text.split("\n", 1)[0]):
            cell_line = arrowed
    return cell_line or first_line


@dataclass(frozen=True)
class CellReplay:
    """What happened to one cell on replay.

    ``same`` / ``differs`` / ``new error`` compare outputs; ``size only`` means only
    plots drawn at another pixel size differ (not a failure); ``ignored`` and
    ``skipped`` follow the cell's tags (or a file write that cannot be redone);
    ``unrecorded`` is a code cell that had never run, so there was nothing to compare.
    """

    index: int  # position among all cells of the notebook (0-based, as nbformat counts)
    kind: str
    verdict: Verdict
    source: str
    diff: str = ""
    status: str = ""
    execution_count: int | None = None
    error_line: str = ""  # the line that raised, when the replay raised
    tags: tuple[str, ...] = ()
    #: The language a kernel cell ran in on replay (``python``, ``r``...); else empty.
    language: str = ""

    @property
    def failed(self) -> bool:
        """True when this cell makes the replay fail (its outputs changed)."""
        return self.verdict in ("differs", "new error")

    @property
    def label(self) -> str:
        """``cell 7 [In 5]``: where to find the cell in the notebook."""
        count = f" [In {self.execution_count}]" if self.execution_count is not None else ""
        return f"cell {self.index}{count}"

    @property
    def headline(self) -> str:
        """The line to show for the cell: the line that raised, else its first code line.

        Magics (``%matplotlib inline``), comments and blank lines are passed over, except
        ``%%writefile NAME``, which says what a file cell does.
        """
        line = self.error_line
        if not line:
            lines = [ln.strip() for ln in self.source.splitlines()]
            code = [
                ln
                for ln in lines
                if ln.startswith("%%writefile") or (ln and not ln.startswith(("%", "#")))
            ]
            line = code[0] if code else next((ln for ln in lines if ln), "")
        return line if len(line) <= 70 else line[:67] + "..."


@dataclass(frozen=True)
class ReplayReport:
    """Per-cell results of a replay, and where the replayed notebook was written."""

    image: str
    cells: tuple[CellReplay, ...]
    notebook: NotebookNode = field(repr=False)
    output: Path | None = None
    duration: float = 0.0
    kernel: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no replayed cell's outputs changed."""
        return not any(c.failed for c in self.cells)

    @property
    def cells_by_index(self) -> dict[int, CellReplay]:
        """The results keyed by the cell's index in the notebook."""
        return {c.index: c for c in self.cells}

    def count(self, verdict: Verdict) -> int:
        """How many cells got ``verdict``."""
        return sum(1 for c in self.cells if c.verdict == verdict)

    @property
    def summary(self) -> str:
        """One line: counts per verdict (``same`` always, others when not zero)."""
        parts = [f"{self.count(v)} {v}" for v in VERDICTS if v == "same" or self.count(v)]
        return ", ".join(parts)
