"""Which kernel a notebook and each of its cells speak, written the way Jupyter tools read it.

**The notebook** carries what Jupyter itself writes: ``metadata.kernelspec`` (``name``,
``display_name``, ``language``) of the sandbox's own kernel, so JupyterLab and nbclient
open an R session with the ``ir`` kernel, and ``metadata.language_info`` as that kernel
reported it in its ``kernel_info_reply`` (R's version, mimetype, pygments lexer...), as
JupyterLab copies it in when a kernel starts.  A kernel's words are the sandbox's, so
only the fields nbformat describes are kept, each string at most
:data:`~kernel_sandbox.limits.NOTEBOOK_LANGUAGE_INFO_CHARS` long.

**A cell** that ran in another language than the notebook's gets
``metadata.vscode.languageId`` — the field VS Code's own ipynb serializer reads and
writes for a cell's language (``getVSCodeCellLanguageId`` in its ``ipynb`` extension),
and which notebook renderers and converters read to highlight a cell (``r``,
``javascript``, ``typescript``, ``shellscript`` for bash).  It is written only where the
language differs from the notebook's, as VS Code writes it, so opening and saving a
session in VS Code changes nothing.  The alternatives were not chosen: SoS's cell
``metadata.kernel`` names a subkernel declared in the notebook's ``metadata.sos``
and means something only to the SoS kernel; a ``%%R`` magic needs rpy2 in the Python
kernel and would run R through Python, not in the R kernel that ran it.

Every kernel cell also records, under ``metadata.kernel_sandbox``, the ``language``,
``kernel`` (kernelspec) and ``context`` (the sandbox's kernel it ran in,
``"default"`` for the sandbox's own; ``context_cwd`` where that kernel started, if not
in the working directory): replay reads those to run each cell with the same
kernel in a context of its own, and falls back on ``vscode.languageId`` for notebooks
written elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contexts import DEFAULT_CONTEXT, KNOWN_KERNELS, normalise_language
from ..kernel.connection import IPYTHON_KERNEL
from ..limits import NOTEBOOK_LANGUAGE_INFO_CHARS
from .cells import META_KEY

__all__ = [
    "PYTHON_KERNELSPEC",
    "PYTHON_LANGUAGE_INFO",
    "CellLanguage",
    "bounded_language_info",
    "cell_language",
    "language_metadata",
    "notebook_kernel",
    "notebook_language",
]

#: What a session of the default (IPython) kernel records until its kernel has spoken.
PYTHON_KERNELSPEC = {
    "name": "python3",
    "display_name": "Python 3 (ipykernel)",
    "language": "python",
}
PYTHON_LANGUAGE_INFO = {
    "name": "python",
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "pygments_lexer": "ipython3",
    "codemirror_mode": {"name": "ipython", "version": 3},
    "nbconvert_exporter": "python",
}
#: VS Code's language ids where they differ from ours (contexts.LANGUAGES' names).
_VSCODE_IDS = {"bash": "shellscript"}
_FROM_VSCODE = {v: k for k, v in _VSCODE_IDS.items()}
#: The ``language_info`` fields nbformat's schema names (all strings but codemirror_mode).
_INFO_FIELDS = (
    "name", "version", "mimetype", "file_extension", "pygments_lexer", "nbconvert_exporter"
)  # fmt: skip


@dataclass(frozen=True)
class CellLanguage:
    """Where a cell ran: its language, its kernelspec and the context (None: not recorded)."""

    language: str
    kernel: str | None = None
    context: str | None = None
    #: Where the context's kernel started, when not the sandbox's working directory.
    cwd: str | None = None


def _text(value: Any) -> str | None:
    return value[:NOTEBOOK_LANGUAGE_INFO_CHARS] if isinstance(value, str) else None


def bounded_language_info(info: Any) -> dict[str, Any] | None:
    """The ``language_info`` of a kernel_info reply, fit for a notebook: the fields
    nbformat describes, strings cut to NOTEBOOK_LANGUAGE_INFO_CHARS; None without a name."""
    if not isinstance(info, Mapping) or not _text(info.get("name")):
        return None
    kept: dict[str, Any] = {}
    for field in _INFO_FIELDS:
        if (value := _text(info.get(field))) is not None:
            kept[field] = value
    mode = info.get("codemirror_mode")
    if isinstance(mode, str):
        kept["codemirror_mode"] = mode[:NOTEBOOK_LANGUAGE_INFO_CHARS]
    elif isinstance(mode, Mapping) and _text(mode.get("name")):
        kept["codemirror_mode"] = {"name": _text(mode["name"])}
        version = mode.get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            kept["codemirror_mode"]["version"] = version
    return kept


def notebook_kernel(sandbox: object) -> tuple[dict[str, str], dict[str, Any]]:
    """``(kernelspec, language_info)`` of ``sandbox``'s own kernel for a notebook's metadata.

    Read from what the sandbox knows already (its kernelspecs, asked at its start for
    any kernel but IPython's, and its kernel's kernel_info reply), so recording costs
    no call into the sandbox; a sandbox that cannot tell (a remote one) is described
    by its ``config.kernel`` and :data:`~kernel_sandbox.contexts.KNOWN_KERNELS`.
    """
    kernel = getattr(getattr(sandbox, "config", None), "kernel", IPYTHON_KERNEL)
    if not isinstance(kernel, str) or kernel == IPYTHON_KERNEL:
        spec = dict(PYTHON_KERNELSPEC)
    else:
        known = getattr(sandbox, "known_kernelspecs", None)
        found = (known() or {}).get(kernel) if callable(known) else None
        found = found or KNOWN_KERNELS.get(kernel)  # a sandbox that cannot tell
        spec = {
            "name": kernel,
            "display_name": found.display_name if found else kernel,
            "language": found.language if found else kernel,
        }
        spec = {k: v[:NOTEBOOK_LANGUAGE_INFO_CHARS] for k, v in spec.items()}
    asked = getattr(sandbox, "kernel_info", None)
    reply = asked() if callable(asked) else {}
    info = bounded_language_info(reply.get("language_info") if isinstance(reply, dict) else None)
    if info is None:
        info = (
            dict(PYTHON_LANGUAGE_INFO)
            if spec["name"] == IPYTHON_KERNEL
            else {"name": spec["language"]}
        )
    return spec, info


def notebook_language(nb: Mapping[str, Any]) -> str:
    """The language a notebook's code cells speak unless told otherwise (``python``...)."""
    meta = nb.get("metadata", {})
    for key, field in (("kernelspec", "language"), ("language_info", "name")):
        value = meta.get(key, {}).get(field) if isinstance(meta.get(key), Mapping) else None
        if isinstance(value, str) and value:
            return normalise_language(value)
    return "python"


def language_metadata(
    language: str, kernel: str, context: str, notebook_lang: str, cwd: str | None = None
) -> dict[str, Any]:
    """Cell metadata saying where it ran (see the module docstring): our own fields (and
    the context's ``context_cwd`` if given), and ``vscode.languageId`` when the language
    is not the notebook's."""
    ours = {"language": language, "kernel": kernel, "context": context}
    meta: dict[str, Any] = {META_KEY: {**ours, **({"context_cwd": cwd} if cwd else {})}}
    if normalise_language(language) != normalise_language(notebook_lang):
        meta["vscode"] = {"languageId": _VSCODE_IDS.get(language, language)}
    return meta


def cell_language(cell: Mapping[str, Any], default: str = "python") -> CellLanguage:
    """Where ``cell`` ran, as recorded; else its ``vscode.languageId``; else ``default``
    (the notebook's language) in the sandbox's own kernel."""
    metadata = cell.get("metadata", {})
    ours = metadata.get(META_KEY, {})
    if isinstance(ours, Mapping) and isinstance(ours.get("language"), str):
        kernel, context, cwd = ours.get("kernel"), ours.get("context"), ours.get("context_cwd")
        return CellLanguage(
            normalise_language(ours["language"]),
            kernel if isinstance(kernel, str) and kernel else None,
            context if isinstance(context, str) and context else None,
            cwd if isinstance(cwd, str) and cwd else None,
        )
    vscode = metadata.get("vscode", {})
    found = vscode.get("languageId") if isinstance(vscode, Mapping) else None
    if isinstance(found, str) and found:
        return CellLanguage(normalise_language(_FROM_VSCODE.get(found, found)))
    return CellLanguage(normalise_language(default), context=DEFAULT_CONTEXT)
