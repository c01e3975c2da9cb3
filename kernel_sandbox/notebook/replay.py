"""Replay: re-execute a notebook's code cells in a fresh sandbox and compare outputs.

Each code cell runs the way it was recorded (see :mod:`.cells`): ``python`` and
``code`` cells and every cell of a hand-written notebook in a kernel (magics and ``!``
work as in Jupyter), ``shell`` cells beside the kernel with ``run_shell``, ``file``
cells through the sandbox's file API.  Kernels are the recorded ones (see
:mod:`.languages`): the sandbox's own is the recorded ``kernel`` setting, each cell
runs in its recorded language, and each recorded context of the session becomes one
context of the replay's sandbox (in the folder it started in), made when its first
cell runs; a cell that names
only a language (``vscode.languageId``, or the notebook's own) runs in the first
kernel of that language.  The cell *source* is what runs, so edits to a notebook are
replayed.  The image is the recorded one unless overridden, else the default image.

Display ids work across cells as in Jupyter: ``handle.update()`` or a second
``display(..., display_id=x)`` in a later cell rewrites the earlier cell's output, the
way nbclient's ``_update_display_id`` does; cells showing a display id are judged
after the last cell, on their final outputs.
Cell tags (``nbval-skip``, ``nbval-ignore-output``, ``raises-exception``,
``nondeterministic``; see :mod:`.tags`) steer what is run and compared.

``areplay`` is the coroutine; ``replay`` is its blocking twin (same parameters),
as ``Sandbox`` is ``AsyncSandbox``'s.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_output

from ..config import DEFAULT_IMAGE, KERNEL_PYTHON
from ..contexts import DEFAULT_CONTEXT
from ..errors import FileOperationError
from ..kernel.connection import IPYTHON_KERNEL
from ..limits import NOTEBOOK_LANGUAGE_INFO_CHARS, REPLAY_PROBE_BYTES
from ..protocols import SandboxLike
from ..results import CommandResult
from ..sync import Sandbox, as_async, run_sync
from .cells import META_KEY, cell_kind, iso_time, jsonable, shell_outputs, split_magic
from .compare import Tolerance, compare_outputs
from .languages import bounded_language_info, cell_language, notebook_language
from .report import CellReplay, ReplayReport, Verdict, failing_line
from .storage import read_notebook, write_notebook_atomic
from .tags import IGNORE_OUTPUT, NONDETERMINISTIC, RAISES_EXCEPTION, SKIP, cell_tags

__all__ = [
    "CellReplay",
    "ReplayReport",
    "areplay",
    "recorded_image",
    "recorded_kernel",
    "replay",
    "replayed_path",
]

_SHELL_MAGICS = {"sh": "sh", "bash": "bash"}
#: Asks the image's kernel Python what a kernel_info_reply would say, beside the kernel
#: (running it *in* the kernel would shift every execution count by one).
#: Run isolated (``-I``): a json.py in the working directory does not answer for it.
_KERNEL_PROBE = (
    "import json, sys, IPython, ipykernel\n"
    "from ipykernel.ipkernel import IPythonKernel\n"
    "print(json.dumps({'language_info': IPythonKernel.language_info,"
    " 'python': sys.version.split()[0], 'ipython': IPython.__version__,"
    " 'ipykernel': ipykernel.__version__}))"
)
CellCallback = Callable[[CellReplay], Any]


def replayed_path(path: str | os.PathLike[str]) -> Path:
    """Default output of a replay: ``NAME.replay.ipynb`` beside ``NAME.ipynb``."""
    source = Path(path)
    return source.with_name(f"{source.stem}.replay.ipynb")


def recorded_image(nb: NotebookNode) -> str | None:
    """The image a notebook was recorded in, from its metadata (None if not ours)."""
    meta = nb.metadata.get(META_KEY, {})
    image = meta.get("image") if isinstance(meta, Mapping) else None
    return image if isinstance(image, str) and image else None


def recorded_working_dir(nb: NotebookNode) -> str | None:
    meta = nb.metadata.get(META_KEY, {})
    settings = meta.get("sandbox", {}) if isinstance(meta, Mapping) else {}
    wd = settings.get("working_dir") if isinstance(settings, Mapping) else None
    return wd if isinstance(wd, str) and wd.startswith("/") else None


def recorded_kernel(nb: NotebookNode) -> str | None:
    """The kernelspec a session's sandbox ran as its own (None: not recorded, IPython's)."""
    meta = nb.metadata.get(META_KEY, {})
    settings = meta.get("sandbox", {}) if isinstance(meta, Mapping) else {}
    kernel = settings.get("kernel") if isinstance(settings, Mapping) else None
    return kernel if isinstance(kernel, str) and kernel else None


async def _run_cell(
    sandbox: SandboxLike, cell: NotebookNode, timeout: float | None, place: Mapping[str, Any]
) -> tuple[str, list[Any], int | None, Any]:
    """Execute one cell (a kernel cell where ``place`` says: run_code's ``language`` or
    ``context``); return (status, outputs, execution_count, Execution or None)."""
    kind = cell_kind(cell)
    magic = split_magic(cell.source)
    if kind in ("shell", "file") and magic and magic[0] in _SHELL_MAGICS:
        command = magic[2]
        if magic[0] == "bash":
            import shlex

            command = f"bash -c {shlex.quote(command)}"
        result: CommandResult = await sandbox.run_shell(command, timeout=timeout)
        status = "ok" if result.ok else ("timeout" if result.timed_out else "error")
        return status, shell_outputs(result), None, None
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
            return "error", [error], None, None
        return "ok", [], None, None
    execution = await sandbox.run_code(cell.source, timeout=timeout, **place)
    outputs = [nbformat.from_dict(jsonable(o)) for o in execution.outputs]
    return execution.status, outputs, execution.execution_count, execution


def _unreproducible_write(cell: NotebookNode) -> bool:
    """A markdown note for a file write whose content was not recorded."""
    meta = cell.metadata.get(META_KEY, {})
    return (
        cell.cell_type == "markdown"
        and cell_kind(cell) == "file"
        and meta.get("operation") in ("write", "append", "upload")
        and not meta.get("error")
    )


async def _kernel_versions(sandbox: SandboxLike) -> dict[str, Any]:
    """``language_info`` and versions of the kernel the replay runs on (or why unknown):
    what any kernel but IPython said in its kernel_info reply, IPython's asked beside it."""
    asked = getattr(sandbox, "kernel_info", None)
    reply = asked() if callable(asked) else {}
    info = bounded_language_info(reply.get("language_info"))
    if info is not None and getattr(sandbox.config, "kernel", IPYTHON_KERNEL) != IPYTHON_KERNEL:
        said = {k: reply.get(k) for k in ("implementation", "implementation_version")}
        versions = {
            k: v[:NOTEBOOK_LANGUAGE_INFO_CHARS] for k, v in said.items() if isinstance(v, str)
        }
        return {"language_info": info, **versions}
    probe = shlex.quote(_KERNEL_PROBE)
    command = f"{KERNEL_PYTHON} -I -c {probe} 2>/dev/null || python3 -I -c {probe}"
    try:
        result: CommandResult = await sandbox.run_shell(command, timeout=60)
        answer = result.stdout.strip()
        if not result.ok or len(answer) > REPLAY_PROBE_BYTES:
            raise ValueError(result.stderr.strip()[-300:] or f"exit status {result.exit_code}")
        info = json.loads(answer)
        if not isinstance(info, dict) or not isinstance(info.get("language_info"), dict):
            raise ValueError("unexpected answer")
        return info
    except (ValueError, OSError) as exc:
        return {"error": f"could not ask the kernel for its versions: {exc}"}


class _Replay:
    """One replay in progress: the replayed notebook, the display map, the verdicts."""

    def __init__(
        self,
        replayed: NotebookNode,
        tolerance: Tolerance,
        target: Path | None,
        on_cell: CellCallback | None,
    ) -> None:
        self.nb = replayed
        self.tolerance = tolerance
        self.target = target
        self.on_cell = on_cell
        self.results: dict[int, CellReplay] = {}
        # display id -> (cell index, output index) of every output showing it, as
        # nbclient's NotebookClient._display_id_map
        self.displays: dict[str, list[tuple[int, int]]] = {}
        # cells showing a display id, judged at the end: index -> execution status
        self.pending: dict[int, str] = {}
        #: The language of cells that do not say theirs (the notebook's).
        self.language = notebook_language(replayed)
        #: Each recorded context (but the default) -> the replay's context made for it.
        self.contexts: dict[str, str] = {}

    async def place(self, sandbox: SandboxLike, cell: NotebookNode) -> dict[str, Any]:
        """run_code's ``language`` or ``context`` for a kernel cell (module docstring)."""
        where = cell_language(cell, self.language)
        create = getattr(sandbox, "create_context", None)
        if where.context in (None, DEFAULT_CONTEXT) or not callable(create):
            return {"language": where.language}
        if where.context not in self.contexts:
            made = await create(where.language, kernel=where.kernel, cwd=where.cwd)
            self.contexts[where.context] = made.id
        return {"context": self.contexts[where.context]}

    def finish(self) -> None:
        """Drop the recorded outputs of ``same`` cells: the outputs shown are equivalent."""
        for index, result in self.results.items():
            meta = self.nb.cells[index].metadata.get(META_KEY, {}).get("replay", {})
            if result.verdict == "same" and meta.pop("recorded_outputs", None) is not None:
                meta["recorded_outputs_equivalent"] = True
        self.save()

    def save(self) -> None:
        if self.target is not None:
            write_notebook_atomic(self.nb, self.target)

    def publish(self, result: CellReplay) -> None:
        self.results[result.index] = result
        self.save()
        if self.on_cell is not None:
            self.on_cell(result)

    async def run(
        self, sandbox: SandboxLike, index: int, cell: NotebookNode, timeout: float | None
    ) -> None:
        kind = cell_kind(cell) or "python"
        tags = cell_tags(cell)
        recorded = list(cell.get("outputs", []))
        meta = cell.metadata.setdefault(META_KEY, {})
        if tags & SKIP:
            meta["replay"] = {"verdict": "skipped", "reason": "tagged " + "/".join(tags & SKIP)}
            self.publish(CellReplay(index, kind, "skipped", cell.source, tags=tuple(sorted(tags))))
            return
        never_ran = cell_kind(cell) is None and not recorded and cell.get("execution_count") is None
        place = await self.place(sandbox, cell) if kind in ("python", "code") else {}
        status, outputs, count, execution = await _run_cell(sandbox, cell, timeout, place)
        cell.outputs = outputs
        cell.execution_count = count
        meta["replay"] = {"status": status, "recorded_outputs": recorded}
        if never_ran:
            meta["replay"]["unrecorded"] = True
        if execution is not None:
            self._apply_displays(index, execution)
        if execution is not None and execution.display_ids:
            self.pending[index] = status  # a later cell may still update its displays
            self.save()
        else:
            self.publish(self._judge(index, cell, status))

    def judge_pending(self) -> None:
        """Judge the cells that show display ids, now that no later cell can update them."""
        for index, status in sorted(self.pending.items()):
            self.publish(self._judge(index, self.nb.cells[index], status))
        self.pending.clear()

    def _apply_displays(self, index: int, execution: Any) -> None:
        """Apply this cell's display updates to earlier cells; remember its display ids."""
        for display_id, update in execution.display_updates.items():
            for cell_index, output_index in self.displays.get(display_id, []):
                if cell_index == index:
                    continue  # the kernel layer already updated this cell's own outputs
                output = self.nb.cells[cell_index].outputs[output_index]
                output["data"] = nbformat.from_dict(jsonable(update["data"]))
                output["metadata"] = nbformat.from_dict(jsonable(update["metadata"]))
        for display_id, positions in execution.display_ids.items():
            self.displays.setdefault(display_id, []).extend((index, p) for p in positions)

    def _judge(self, index: int, cell: NotebookNode, status: str | None = None) -> CellReplay:
        """Compare a replayed cell with its recording; store the verdict in its metadata."""
        meta = cell.metadata[META_KEY]["replay"]
        status = status or meta.get("status", "")
        tags = cell_tags(cell)
        recorded = meta["recorded_outputs"]
        comparison = compare_outputs(
            recorded,
            cell.outputs,
            tolerance=self.tolerance,
            values=NONDETERMINISTIC not in tags,
            expect_error=RAISES_EXCEPTION in tags,
        )
        verdict: Verdict = comparison.verdict
        diff = comparison.diff
        if IGNORE_OUTPUT in tags:
            verdict, diff = "ignored", ""
        elif meta.get("unrecorded") and verdict != "new error":
            verdict, diff = "unrecorded", ""
        meta["verdict"] = verdict
        meta.pop("diff", None)
        if diff:
            meta["diff"] = diff
        error = next((o for o in cell.outputs if o.get("output_type") == "error"), None)
        return CellReplay(
            index,
            cell_kind(cell) or "python",
            verdict,
            cell.source,
            diff,
            status,
            cell.get("execution_count"),
            failing_line(list(error.get("traceback", []))) if error else "",
            tuple(sorted(tags)),
            cell_language(cell, self.language).language
            if (cell_kind(cell) or "python") in ("python", "code")
            else "",
        )


async def areplay(
    notebook: str | os.PathLike[str] | NotebookNode,
    *,
    image: str | None = None,
    timeout: float | None = None,
    output: str | os.PathLike[str] | None = None,
    sandbox: SandboxLike | Sandbox | None = None,
    sandbox_options: Mapping[str, Any] | None = None,
    tolerance: Tolerance | None = None,
    on_cell: CellCallback | None = None,
) -> ReplayReport:
    """Re-execute the code cells of ``notebook`` in order and compare their outputs.

    ``image`` overrides the recorded image (default image when none is recorded).
    ``output`` is where the replayed notebook goes; for a path input it defaults to
    :func:`replayed_path`, and it is rewritten after every cell.  Pass ``sandbox``
    (an ``AsyncSandbox``; :func:`replay` also takes a blocking ``Sandbox``) to use an
    existing one (it is not closed);
    ``sandbox_options`` are extra ``AsyncSandbox.create`` settings.  ``tolerance``
    loosens or tightens the comparison (see :class:`~.compare.Tolerance`).
    ``on_cell`` sees each result as it is known; cells that show a display id are
    judged after the last cell, since a later cell may still update them.
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
    state = _Replay(replayed, tolerance or Tolerance(), target, on_cell)
    started = time.monotonic()

    owned = sandbox is None
    if sandbox is None:
        from ..sandbox import AsyncSandbox

        options: dict[str, Any] = {"image": chosen}
        if wd := recorded_working_dir(original):
            options["working_dir"] = wd
        if own := recorded_kernel(original):
            options["kernel"] = own
        options.update(sandbox_options or {})
        sandbox = await AsyncSandbox.create(**options)
    sandbox = as_async(sandbox)
    try:
        kernel = await _kernel_versions(sandbox)
        _describe_kernel(replayed, kernel)
        for index, cell in enumerate(replayed.cells):
            if _unreproducible_write(cell):
                why = "file content was not recorded; later cells may miss this file"
                cell.metadata[META_KEY]["replay"] = {"verdict": "skipped", "reason": why}
                state.publish(CellReplay(index, "file", "skipped", cell.source, why))
            elif cell.cell_type == "code" and cell.source.strip():
                await state.run(sandbox, index, cell, timeout)
        state.judge_pending()
    finally:
        if owned:
            await sandbox.close()
    duration = time.monotonic() - started
    cells = tuple(state.results[i] for i in sorted(state.results))
    report = ReplayReport(chosen, cells, replayed, target, duration, kernel)
    replayed.metadata[META_KEY]["replay"].update(
        status="ok" if report.ok else "differs",
        summary=report.summary,
        finished_at=iso_time(),
        duration=round(duration, 3),
    )
    state.finish()
    return report


def _describe_kernel(nb: NotebookNode, kernel: Mapping[str, Any]) -> None:
    """Put the replay kernel's ``language_info`` and versions into the notebook."""
    info = nb.metadata[META_KEY]["replay"]
    if "error" in kernel:
        info["kernel"] = {"error": kernel["error"]}
        return
    if "language_info" in nb.metadata:
        info["recorded_language_info"] = nb.metadata["language_info"]
    nb.metadata["language_info"] = nbformat.from_dict(jsonable(kernel["language_info"]))
    names = ("python", "ipython", "ipykernel", "implementation", "implementation_version")
    info["kernel"] = {k: kernel[k] for k in names if k in kernel}


def replay(
    notebook: str | os.PathLike[str] | NotebookNode,
    *,
    image: str | None = None,
    timeout: float | None = None,
    output: str | os.PathLike[str] | None = None,
    sandbox: SandboxLike | Sandbox | None = None,
    sandbox_options: Mapping[str, Any] | None = None,
    tolerance: Tolerance | None = None,
    on_cell: CellCallback | None = None,
) -> ReplayReport:
    """Blocking :func:`areplay` (safe inside a running event loop)."""
    return run_sync(
        areplay(
            notebook,
            image=image,
            timeout=timeout,
            output=output,
            sandbox=sandbox,
            sandbox_options=sandbox_options,
            tolerance=tolerance,
            on_cell=on_cell,
        )
    )
