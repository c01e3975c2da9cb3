"""How each step of a session becomes a notebook cell, and how replay reads it back.

Every cell we write carries ``metadata["kernel_sandbox"]["kind"]``:

``message``  a markdown cell with a user / assistant / system message;
``python``   a code cell with the code the kernel ran and its real outputs;
``code``     the same for a kernel of another language (R, JavaScript, bash...); both
             say where they ran (``language``, ``kernel``, ``context``, see
             :mod:`.languages`);
``shell``    a ``%%sh`` code cell (Jupyter re-runs it with the same ``/bin/sh`` the
             sandbox used), stdout and stderr as stream outputs, the exit status in
             metadata and, when it is not 0, as a last stderr line;
``file``     a file operation: a write or append becomes a ``%%writefile`` cell, a
             mkdir or remove a ``%%sh`` cell, so the notebook re-creates the files the
             later cells read; anything else (reads, listings, failed operations,
             binary or unknown content) is a markdown note, since it changed nothing;
``note``     a markdown remark from the recorder (e.g. "this execution timed out").

Notebooks written by hand have no such metadata; replay then treats every code cell
as kernel code, exactly as Jupyter would.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import nbformat
from nbformat import NotebookNode
from nbformat.corpus.words import generate_corpus_id as random_cell_id
from nbformat.notebooknode import from_dict
from nbformat.validator import ValidationError

from ..limits import NOTEBOOK_EMBEDDED_FILE_BYTES
from ..results import CommandResult, Execution
from .budget import OutputBudget
from .tags import NONDETERMINISTIC, nondeterminism

__all__ = [
    "META_KEY",
    "CellKind",
    "cell_kind",
    "decode_text",
    "file_cell",
    "iso_time",
    "jsonable",
    "message_cell",
    "note_cell",
    "python_cell",
    "shell_cell",
    "shell_outputs",
    "split_magic",
]

#: Namespaced metadata key used on cells and on the notebook.
META_KEY = "kernel_sandbox"
CellKind = Literal["message", "python", "code", "shell", "file", "note"]

_WRITE_OPS = {"write": "", "append": "-a "}
#: ``delete`` is what sandbox.files.remove and the file_operation tool report;
#: ``remove`` is kept for notebooks recorded before.
_SHELL_OPS = {"mkdir": "mkdir -p --", "delete": "rm -rf --", "remove": "rm -rf --"}
_ROLE_TITLES = {"user": "User", "assistant": "Assistant", "system": "System"}


# Cells are built here rather than by nbformat.v4's new_code_cell/new_markdown_cell:
# those validate a lone cell with jsonschema (about 1.5 ms a cell, on a server's event
# loop for every call), while a one-cell notebook goes through nbformat's compiled
# validator (fastjsonschema) in a few dozen microseconds.  Same checks, same errors.


def new_code_cell(source: str = "", **fields: Any) -> NotebookNode:
    """A validated code cell (nbformat's ``new_code_cell``, checked faster)."""
    cell = {"id": random_cell_id(), "cell_type": "code", "metadata": {}}
    return _checked({**cell, "execution_count": None, "source": source, "outputs": [], **fields})


def new_markdown_cell(source: str = "", **fields: Any) -> NotebookNode:
    """A validated markdown cell (nbformat's ``new_markdown_cell``, checked faster)."""
    cell = {"id": random_cell_id(), "cell_type": "markdown", "metadata": {}}
    return _checked({**cell, "source": source, **fields})


def new_output(output_type: str, **fields: Any) -> NotebookNode:
    """An output, checked with the cell that holds it (see :func:`new_code_cell`)."""
    node: NotebookNode = from_dict({"output_type": output_type, **fields})
    return node


def _checked(cell: dict[str, Any]) -> NotebookNode:
    node: NotebookNode = from_dict(cell)
    nbformat.validate({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [node]})
    return node


def iso_time(timestamp: float | None = None) -> str:
    """A UTC ISO-8601 time for metadata (now, or a ``time.time()`` value)."""
    moment = datetime.now(UTC) if timestamp is None else datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """``value`` made JSON-safe (unknown objects become strings), so metadata always saves."""
    return json.loads(json.dumps(value, default=str))


def _meta(kind: CellKind, metadata: Mapping[str, Any] | None, **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": kind}
    data.update({k: v for k, v in fields.items() if v is not None})
    if metadata:
        data.update(jsonable(dict(metadata)))
    return {META_KEY: data}


def cell_kind(cell: Mapping[str, Any]) -> str | None:
    """The kind we recorded for ``cell``, or None for cells not written by the recorder."""
    meta = cell.get("metadata", {}).get(META_KEY)
    return meta.get("kind") if isinstance(meta, Mapping) else None


def split_magic(source: str) -> tuple[str, list[str], str] | None:
    """``(magic, args, body)`` for a cell starting with ``%%magic args``; else None."""
    first, _, body = source.partition("\n")
    if not first.startswith("%%"):
        return None
    parts = shlex.split(first[2:])
    if not parts:
        return None
    return parts[0], parts[1:], body


def message_cell(role: str, text: str, metadata: Mapping[str, Any] | None = None) -> NotebookNode:
    """A markdown cell showing who spoke, then what they said."""
    title = _ROLE_TITLES.get(role, role.title())
    source = f"**{title}**\n\n{text}" if text else f"**{title}**"
    return new_markdown_cell(source, metadata=_meta("message", metadata, role=role))


def note_cell(text: str, metadata: Mapping[str, Any] | None = None) -> NotebookNode:
    """A markdown remark from the recorder; replay ignores it."""
    return new_markdown_cell(text, metadata=_meta("note", metadata))


def _complete(output: dict[str, Any], count: int | None) -> NotebookNode:
    """Fill fields nbformat requires that hand-made outputs often leave out."""
    if output.get("output_type") in ("display_data", "execute_result"):
        output.setdefault("metadata", {})
        output.setdefault("data", {})
    if output.get("output_type") == "execute_result":
        output.setdefault("execution_count", count)
    return nbformat.from_dict(output)


def python_cell(
    code: str,
    execution: Execution,
    metadata: Mapping[str, Any] | None = None,
    started_at: float | None = None,
    *,
    seeded: bool = False,
    budget: OutputBudget | None = None,
    where: Mapping[str, Any] | None = None,
) -> NotebookNode:
    """A code cell with the real outputs and execution count of one ``run_code`` call.

    ``budget`` (the notebook's) bounds what the cell keeps of the outputs (see
    :mod:`.budget`); without one every output is kept.  ``where`` is the cell metadata
    saying which kernel ran it (:func:`.languages.language_metadata`); a cell of
    another language than python is of kind ``code``.

    The cell is tagged ``nondeterministic`` (see :mod:`.tags`) when ``metadata`` says
    ``nondeterministic`` (the agent knows) or the code is timed or draws unseeded
    random numbers (``seeded``: an earlier cell of the session set a seed).
    """
    flagged = (metadata or {}).get("nondeterministic")
    reason = ("marked by the agent" if flagged is True else flagged) or nondeterminism(code, seeded)
    outputs = [_complete(jsonable(o), execution.execution_count) for o in execution.outputs]
    if budget is not None:
        outputs = budget.take(outputs)
    placed = dict(where or {})
    ours = dict(placed.pop(META_KEY, {}))
    kind: CellKind = "python" if ours.get("language", "python") == "python" else "code"
    meta = _meta(
        kind,
        metadata,
        **ours,
        status=execution.status,
        duration=round(execution.duration, 4),
        state_lost=execution.state_lost,
        message=execution.message or None,
        truncated_bytes=execution.truncated_bytes or None,
        started_at=iso_time(started_at) if started_at else None,
    )
    meta.update(placed)
    if reason:
        meta[META_KEY]["nondeterministic"] = str(reason)
        meta["tags"] = [NONDETERMINISTIC]
    try:
        return new_code_cell(
            code, execution_count=execution.execution_count, outputs=outputs, metadata=meta
        )
    except ValidationError as exc:  # keep the session recordable whatever the kernel sent
        note = new_output("stream", name="stderr", text=f"[outputs not recordable: {exc}]\n")
        return new_code_cell(
            code, execution_count=execution.execution_count, outputs=[note], metadata=meta
        )


def shell_outputs(result: CommandResult, budget: OutputBudget | None = None) -> list[NotebookNode]:
    """stdout and stderr as stream outputs; a non-zero exit status ends stderr."""
    stderr = result.stderr
    if result.exit_code != 0 and not result.timed_out:
        stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + (
            f"[exit status {result.exit_code}]\n"
        )
    outputs = []
    if result.stdout:
        outputs.append(new_output("stream", name="stdout", text=result.stdout))
    if stderr:
        outputs.append(new_output("stream", name="stderr", text=stderr))
    return budget.take(outputs) if budget is not None else outputs


def shell_cell(
    command: str,
    result: CommandResult,
    cwd: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    started_at: float | None = None,
    budget: OutputBudget | None = None,
) -> NotebookNode:
    """A ``%%sh`` code cell: re-runnable in Jupyter, and by replay beside the kernel."""
    prefix = f"cd {shlex.quote(cwd)}\n" if cwd else ""
    meta = _meta(
        "shell",
        metadata,
        command=command,
        cwd=cwd,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration=round(result.duration, 4),
        truncated_bytes=result.truncated_bytes or None,
        started_at=iso_time(started_at) if started_at else None,
    )
    outputs = shell_outputs(result, budget)
    return new_code_cell(f"%%sh\n{prefix}{command}", outputs=outputs, metadata=meta)


def _size(n: int | None) -> str:
    if n is None:
        return ""
    return f" ({n} B)" if n < 1024 else f" ({n / 1024:.1f} KB)"


def file_cell(
    operation: str,
    path: str,
    *,
    content: bytes | str | None = None,
    size: int | None = None,
    error: str = "",
    detail: str = "",
    metadata: Mapping[str, Any] | None = None,
    started_at: float | None = None,
) -> NotebookNode:
    """A cell that shows a file operation and, where it changed files, redoes it."""
    text = decode_text(content)
    if isinstance(content, bytes) and size is None:
        size = len(content)
    elif isinstance(content, str) and size is None:
        size = len(content.encode())
    common = {
        "operation": operation,
        "path": path,
        "size": size,
        "error": error or None,
        "detail": detail or None,
        "started_at": iso_time(started_at) if started_at else None,
    }
    if not error and operation in _SHELL_OPS:
        source = f"%%sh\n{_SHELL_OPS[operation]} {shlex.quote(path)}"
        return new_code_cell(source, metadata=_meta("file", metadata, **common))
    embeddable = text is not None and len(text) <= NOTEBOOK_EMBEDDED_FILE_BYTES
    if not error and operation in _WRITE_OPS and embeddable:
        source = f"%%writefile {_WRITE_OPS[operation]}{shlex.quote(path)}\n{text}"
        return new_code_cell(source, metadata=_meta("file", metadata, **common))
    lines = [f"*File operation* `{operation}` `{path}`{_size(size)}"]
    if detail:
        lines.append(f"\n{detail}")
    if error:
        lines.append(f"\n**Failed:** {error}")
    elif operation in _WRITE_OPS:
        lines.append("\n(content not recorded: replay cannot re-create this file)")
    return new_markdown_cell("\n".join(lines), metadata=_meta("file", metadata, **common))


def decode_text(content: bytes | str | None) -> str | None:
    """``content`` as text, or None when it is binary (it is then described, not embedded)."""
    if content is None or isinstance(content, str):
        return content
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return None
