"""Export a session notebook with nbconvert: HTML to read in a browser, or a Python script.

The HTML works offline, where sandboxes live: PNG plots are embedded as ``data:``
URIs, the CSS is inlined, and nothing is loaded from a CDN (no require.js, MathJax,
mermaid or widget manager; LaTeX then shows as source).  HTML and markdown from the
session are sanitized (nbconvert's ``sanitize_html``): a sandbox's ``<script>`` or
``onerror=`` never runs in the reader's browser.  A replayed notebook's page
starts with the replay's summary and shows every code cell's verdict and diff
(template: ``templates/kernel_sandbox_offline.html.j2``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

from .._extras import require_extra
from ..errors import NotebookError
from .storage import read_notebook

__all__ = ["ExportFormat", "export_notebook"]

ExportFormat = Literal["html", "py"]
_SUFFIX = {"html": ".html", "py": ".py"}
_TEMPLATES = Path(__file__).parent / "templates"


def export_notebook(
    path: str | os.PathLike[str],
    to: ExportFormat = "html",
    output: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``path`` as HTML or Python next to it (or to ``output``); return the new file."""
    if to not in _SUFFIX:
        raise NotebookError(f"cannot export to {to!r}; choose 'html' or 'py'")
    source = Path(path)
    nb = read_notebook(source)
    with require_extra("notebook", "exporting a notebook"):
        from nbconvert import HTMLExporter, PythonExporter

    exporter = (
        HTMLExporter(
            embed_images=True,
            template_name="lab",
            extra_template_paths=[str(_TEMPLATES)],
            template_file="kernel_sandbox_offline.html.j2",
            # A sandbox's outputs are untrusted: no live <script>, handlers or iframes.
            sanitize_html=True,
        )
        if to == "html"
        else PythonExporter()
    )
    # nbconvert logs a warning per plot without alt text; a session's plots have none.
    logging.getLogger("traitlets").setLevel(logging.ERROR)
    try:
        body, _resources = exporter.from_notebook_node(
            nb, resources={"metadata": {"name": source.stem}}
        )
    except Exception as exc:  # nbconvert raises many unrelated types
        raise NotebookError(f"nbconvert could not export {source} to {to}: {exc}") from exc
    target = Path(output) if output is not None else source.with_suffix(_SUFFIX[to])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(body, encoding="utf-8")
    return target
