"""Replay: re-execute a notebook's code cells in a fresh sandbox and compare outputs.

Each code cell runs the way it was recorded (see :mod:`.cells`): ``python`` cells and
every cell of a hand-written notebook in the kernel (magics and ``!`` work as in
Jupyter), ``shell`` cells beside the kernel with ``run_shell``, ``file`` cells through
the sandbox's file API.  The cell *source* is what runs, so edits to a notebook are
replayed.  The image is the recorded one unless overridden, else the default image.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_output

from ..config import DEFAULT_IMAGE
from ..errors import FileOperationError
from ..results import CommandResult, Execution
from .cells import META_KEY, cell_kind, iso_time, jsonable, shell_outputs, split_magic
from .compare import compare_outputs
from .storage import read_notebook, write_notebook_atomic

__all__ = [
    "CellReplay",
    "ReplayReport",
    "recorded_image",
    "replay",
    "replay_notebook",
    "replayed_path",
]

Verdict = Literal["same", "differs", "new error", "skipped", "unrecorded"]
_SHELL_MAGICS = {"sh": "sh", "bash": "bash"}


@dataclass(frozen=True)
class CellReplay:
    """What happened to one cell on replay.

    ``same`` / ``differs`` / ``new error`` compare outputs; ``unrecorded`` is a code
    cell that had never run (no outputs, no execution count), so there was nothing to
    compare; ``skipped`` is a recorded file write whose content was not recorded.
    """

    index: int  # position among all cells of the notebook
    number: int  # 1-based position among the replayed code cells
    kind: str
    verdict: Verdict
    source: str
    diff: str = ""
    status: str = ""

    @property
    def failed(self) -> bool:
        """True when this cell makes the replay fail (its outputs changed)."""
        return self.verdict in ("differs", "new error")

    @property
    def headline(self) -> str:
        """The first non-empty source line, shortened, to name the cell in a report."""
        lines = [ln.strip() for ln in self.source.splitlines() if ln.strip()]
        if len(lines) > 1 and lines[0] in ("%%sh", "%%bash"):
            lines = lines[1:]
        line = lines[0] if lines else ""
        return line if len(line) <= 60 else line[:57] + "..."


@dataclass(frozen=True)
class ReplayReport:
    """Per-cell results of a replay, and where the replayed notebook was written."""

    image: str
    cells: tuple[CellReplay, ...]
    notebook: NotebookNode = field(repr=False)
    output: Path | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every replayed cell matched its recorded outputs."""
        return not any(c.failed for c in self.cells)

    def count(self, verdict: Verdict) -> int:
        """How many cells got ``verdict``."""
        return sum(1 for c in self.cells if c.verdict == verdict)

    @property
    def summary(self) -> str:
        """One line: counts per verdict."""
        verdicts: tuple[Verdict, ...] = ("same", "differs", "new error", "unrecorded", "skipped")
        parts = [f"{self.count(v)} {v}" for v in verdicts]
        return ", ".join(p for p in parts if not p.startswith("0 ") or p.endswith("same"))


def replayed_path(path: str | os.PathLike[str]) -> Path:
    """Default output of a replay: ``NAME.replay.ipynb`` beside ``NAME.ipynb``."""
    source = Path(path)
    return source.with_name(f"{source.stem}.replay.ipynb")


def recorded_image(nb: NotebookNode) -> str | None:
    """The image a notebook was recorded in, from its metadata (None if not ours)."""
    meta = nb.metadata.get(META_KEY, {})
    image = meta.get("image") if isinstance(meta, Mapping) else None
    return image if isinstance(image, str) and image else None


def _recorded_working_dir(nb: NotebookNode) -> str | None:
    meta = nb.metadata.get(META_KEY, {})
    settings = meta.get("sandbox", {}) if isinstance(meta, Mapping) else {}
    wd = settings.get("working_dir") if isinstance(settings, Mapping) else None
    return wd if isinstance(wd, str) and wd.startswith("/") else None


async def _run_cell(
    sandbox: Any, cell: NotebookNode, timeout: float | None
) -> tuple[str, list[Any], int | None]:
    """Execute one cell; return (status, outputs, execution_count)."""
    kind = cell_kind(cell)
    magic = split_magic(cell.source)
    if kind in ("shell", "file") and magic and magic[0] in _SHELL_MAGICS:
        command = magic[2]
        if magic[0] == "bash":
            import shlex

            command = f"bash -c {shlex.quote(command)}"
        result: CommandResult = await sandbox.run_shell(command, timeout=timeout)
        status = "ok" if result.ok else ("timeout" if result.timed_out else "error")
        return status, shell_outputs(result), None
    if kind == "file" and magic and magic[0] == "writefile":
        append = "-a" in magic[1] or "--append" in magic[1]
        paths = [a for a in magic[1] if not a.startswith("-")]
        try:
            if not paths:
                raise FileOperationError("%%writefile needs a file name")
            if append:
                await sandbox.files.append(paths[0], magic[2])
            else:
                await sandbox.files.write(paths[0], magic[2])
        except FileOperationError as exc:
            error = new_output(
                "error", ename=type(exc).__name__, evalue=str(exc), traceback=[str(exc)]
            )
            return "error", [error], None
        return "ok", [], None
    execution: Execution = await sandbox.run_python(cell.source, timeout=timeout)
    outputs = [nbformat.from_dict(jsonable(o)) for o in execution.outputs]
    return execution.status, outputs, execution.execution_count


def _unreproducible_write(cell: NotebookNode) -> bool:
    """A markdown note for a file write whose content was not recorded."""
    meta = cell.metadata.get(META_KEY, {})
    return (
        cell.cell_type == "markdown"
        and cell_kind(cell) == "file"
        and meta.get("operation") in ("write", "append", "upload")
        and not meta.get("error")
    )


async def replay_notebook(
    notebook: str | os.PathLike[str] | NotebookNode,
    *,
    image: str | None = None,
    timeout: float | None = None,
    output: str | os.PathLike[str] | None = None,
    sandbox: Any = None,
    sandbox_options: Mapping[str, Any] | None = None,
    on_cell: Callable[[CellReplay], Any] | None = None,
) -> ReplayReport:
    """Re-execute the code cells of ``notebook`` in order and compare their outputs.

    ``image`` overrides the recorded image (default image when none is recorded).
    ``output`` is where the replayed notebook goes; for a path input it defaults to
    :func:`replayed_path`, and it is rewritten after every cell.  Pass ``sandbox`` to
    use an existing one (it is not closed); ``sandbox_options`` are extra
    ``AsyncSandbox.create`` settings.  ``on_cell`` sees each result as it is known.
    """
    if isinstance(notebook, NotebookNode):
        original = notebook
        target = Path(output) if output is not None else None
    else:
        original = read_notebook(notebook)
        target = Path(output) if output is not None else replayed_path(notebook)
    chosen = image or recorded_image(original) or DEFAULT_IMAGE
    replayed = nbformat.from_dict(jsonable(original))
    session = dict(replayed.metadata.get(META_KEY) or {})
    session["replay"] = {"image": chosen, "started_at": iso_time(), "status": "running"}
    replayed.metadata[META_KEY] = session
    started = time.monotonic()

    owned = sandbox is None
    if owned:
        from ..sandbox import AsyncSandbox

        options: dict[str, Any] = {"image": chosen}
        if wd := _recorded_working_dir(original):
            options["working_dir"] = wd
        options.update(sandbox_options or {})
        sandbox = await AsyncSandbox.create(**options)
    results: list[CellReplay] = []
    try:
        for index, cell in enumerate(replayed.cells):
            number = len(results) + 1
            if _unreproducible_write(cell):
                why = "file content was not recorded; later cells may miss this file"
                result = CellReplay(index, number, "file", "skipped", cell.source, why)
            elif cell.cell_type == "code" and cell.source.strip():
                result = await _replay_cell(sandbox, index, number, cell, timeout)
            else:
                continue
            results.append(result)
            if target is not None:
                write_notebook_atomic(replayed, target)
            if on_cell is not None:
                on_cell(result)
    finally:
        if owned:
            await sandbox.close()
    duration = time.monotonic() - started
    report = ReplayReport(chosen, tuple(results), replayed, target, duration)
    replayed.metadata[META_KEY]["replay"].update(
        status="ok" if report.ok else "differs",
        summary=report.summary,
        finished_at=iso_time(),
        duration=round(duration, 3),
    )
    if target is not None:
        write_notebook_atomic(replayed, target)
    return report


async def _replay_cell(
    sandbox: Any, index: int, number: int, cell: NotebookNode, timeout: float | None
) -> CellReplay:
    kind = cell_kind(cell) or "python"
    recorded = list(cell.get("outputs", []))
    never_ran = cell_kind(cell) is None and not recorded and cell.get("execution_count") is None
    status, outputs, count = await _run_cell(sandbox, cell, timeout)
    comparison = compare_outputs(recorded, outputs)
    verdict: Verdict = comparison.verdict
    if never_ran and verdict != "new error":
        verdict = "unrecorded"
    cell.outputs = outputs
    cell.execution_count = count
    cell.metadata.setdefault(META_KEY, {})
    cell.metadata[META_KEY]["replay"] = {"verdict": verdict, "status": status}
    diff = "" if verdict == "unrecorded" else comparison.diff
    return CellReplay(index, number, kind, verdict, cell.source, diff, status)


def replay(
    notebook: str | os.PathLike[str] | NotebookNode,
    *,
    image: str | None = None,
    timeout: float | None = None,
    output: str | os.PathLike[str] | None = None,
    sandbox_options: Mapping[str, Any] | None = None,
    on_cell: Callable[[CellReplay], Any] | None = None,
) -> ReplayReport:
    """Blocking :func:`replay_notebook` (safe inside a running event loop)."""
    from ..sync import run_sync

    return run_sync(
        replay_notebook(
            notebook,
            image=image,
            timeout=timeout,
            output=output,
            sandbox_options=sandbox_options,
            on_cell=on_cell,
        )
    )
