"""Back to a recorded cell: rewind a session, rebuild what a snapshot could not save.

* :func:`arewind` — a fork from any recorded cell of a session notebook: a new sandbox
  (the recorded image and working directory) in which the notebook's cells up to and
  including that one are replayed.  The replayed notebook is the child's: its metadata
  names the parent notebook and the cell it was rewound to.
* :func:`arebuild` — after a portable restore, the variables the snapshot could not
  save (an open file, a socket, a thread...) are made again by replaying the cells of
  the session notebook that bound them, in their order, up to the snapshot's
  execution count.  A cell "binds" a name when it assigns, imports, defines or loops
  over it at its top level (read with :mod:`ast`; a cell that is not Python binds
  nothing).  Replaying re-runs the cell whole, side effects included: it is asked for,
  never done by itself.

``rewind`` and ``rebuild`` are the blocking twins (same parameters).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import nbformat
from nbformat import NotebookNode

from ..errors import ConfigError
from ..protocols import SandboxLike
from ..sync import Sandbox, as_async, run_sync
from .cells import META_KEY, cell_kind, jsonable, split_magic
from .compare import Tolerance
from .replay import areplay, recorded_image, recorded_working_dir
from .report import ReplayReport
from .storage import read_notebook

if TYPE_CHECKING:
    from ..sandbox import AsyncSandbox
    from ..snapshots.model import Snapshot

__all__ = ["Rebuilt", "Rewound", "arebuild", "arewind", "bound_names", "rebuild", "rewind"]


@dataclass(frozen=True)
class Rewound:
    """The new sandbox (the caller closes it) and the replay that made its state."""

    sandbox: AsyncSandbox | Sandbox
    report: ReplayReport


@dataclass(frozen=True)
class Rebuilt:
    """Names made again, each with the index of the last cell that bound it; the cells
    replayed; names no cell binds, or whose cell failed, with the reason."""

    rebuilt: dict[str, int] = field(default_factory=dict)
    cells: tuple[int, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)


def _load(notebook: str | os.PathLike[str] | NotebookNode) -> NotebookNode:
    if isinstance(notebook, NotebookNode):
        return notebook
    return read_notebook(notebook)


def bound_names(source: str) -> set[str]:
    """The names a Python cell binds at its top level (nothing if it does not parse)."""
    if split_magic(source) is not None:
        return set()
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set()
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.add(sub.id)

    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                targets(target)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets(node.target)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.For | ast.AsyncFor):
            targets(node.target)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
    return names


def _is_python(cell: NotebookNode) -> bool:
    return cell.cell_type == "code" and cell_kind(cell) in (None, "python")


async def arewind(
    notebook: str | os.PathLike[str] | NotebookNode,
    cell: int,
    *,
    sandbox_options: Mapping[str, Any] | None = None,
    tolerance: Tolerance | None = None,
) -> Rewound:
    """A new sandbox with the state the session had after cell ``cell`` (an index into
    the notebook's cells), rebuilt by replaying the cells up to it."""
    source = _load(notebook)
    if not 0 <= cell < len(source.cells):
        raise ConfigError(f"cell {cell} is not a cell of the notebook (it has {len(source.cells)})")
    head = nbformat.from_dict(jsonable(source))
    head.cells = head.cells[: cell + 1]
    from ..sandbox import AsyncSandbox  # the notebook layer starts sandboxes, as replay does

    options: dict[str, Any] = {}
    if image := recorded_image(source):
        options["image"] = image
    if wd := recorded_working_dir(source):
        options["working_dir"] = wd
    options.update(sandbox_options or {})
    child = await AsyncSandbox.create(**options)
    try:
        report = await areplay(head, sandbox=child, tolerance=tolerance)
    except BaseException:
        await child.close()
        raise
    parent = str(notebook) if not isinstance(notebook, NotebookNode) else None
    report.notebook.metadata[META_KEY]["rewound_from"] = {"notebook": parent, "cell": cell}
    return Rewound(child, report)


async def arebuild(
    sandbox: SandboxLike | Sandbox,
    notebook: str | os.PathLike[str] | NotebookNode,
    snapshot: Snapshot,
) -> Rebuilt:
    """Make the variables ``snapshot`` could not save again in ``sandbox`` (restored
    from it) by replaying the cells of ``notebook`` that bound them."""
    wanted = set(snapshot.not_saved)
    if not wanted:
        return Rebuilt()
    source = _load(notebook)
    upto = snapshot.execution_count or None
    last: dict[str, int] = {}
    binders: list[int] = []
    for index, cell in enumerate(source.cells):
        count = cell.get("execution_count")
        if not _is_python(cell) or (upto and isinstance(count, int) and count > upto):
            continue
        hits = bound_names(cell.source) & wanted
        if hits:
            binders.append(index)
            last.update(dict.fromkeys(hits, index))
    live = as_async(sandbox)
    failed = {name: "no recorded cell binds it" for name in wanted - set(last)}
    for index in binders:
        ran = await live.run_python(source.cells[index].source)
        if ran.status != "ok":
            why = f"cell {index} failed: {ran.error.ename if ran.error else ran.status}"
            for name, at in list(last.items()):
                if at == index:
                    failed[name] = why
                    del last[name]
    return Rebuilt(rebuilt=last, cells=tuple(binders), failed=failed)


def rewind(
    notebook: str | os.PathLike[str] | NotebookNode,
    cell: int,
    *,
    sandbox_options: Mapping[str, Any] | None = None,
    tolerance: Tolerance | None = None,
) -> Rewound:
    """Blocking :func:`arewind`; its sandbox is a blocking ``Sandbox``."""
    made = run_sync(arewind(notebook, cell, sandbox_options=sandbox_options, tolerance=tolerance))
    assert not isinstance(made.sandbox, Sandbox)
    return Rewound(Sandbox(made.sandbox), made.report)


def rebuild(
    sandbox: SandboxLike | Sandbox,
    notebook: str | os.PathLike[str] | NotebookNode,
    snapshot: Snapshot,
) -> Rebuilt:
    """Blocking :func:`arebuild`."""
    return run_sync(arebuild(sandbox, notebook, snapshot))
