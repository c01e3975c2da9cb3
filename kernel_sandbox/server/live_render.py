"""Notebook cells as HTML fragments for the live session page, safe to show.

Everything in a session notebook came from a sandbox or a model, so none of it is
trusted: text is escaped, markdown is rendered with raw HTML escaped, images are shown
as ``data:`` URLs of their declared type only (PNG, JPEG, GIF, SVG; an SVG in an
``<img>`` runs no script), and an HTML output is shown in an ``<iframe sandbox>``
without ``allow-scripts`` or ``allow-same-origin``: it cannot run code or read the
page (nor its cookie).  Each fragment is bounded (long text is cut in the middle).
"""

from __future__ import annotations

import base64
import html
import re
from typing import Any

import mistune

from ..limits import LIVE_PAGE_TEXT_CHARS
from ..notebook.cells import META_KEY

__all__ = ["render_cell"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_IMAGES = ("image/png", "image/jpeg", "image/gif")
_markdown = mistune.create_markdown(escape=True, plugins=["table", "strikethrough"])


def _text(value: Any) -> str:
    text = "".join(value) if isinstance(value, list) else str(value)
    text = _ANSI.sub("", text)
    if len(text) > LIVE_PAGE_TEXT_CHARS:
        half = LIVE_PAGE_TEXT_CHARS // 2
        dropped = len(text) - LIVE_PAGE_TEXT_CHARS
        text = f"{text[:half]}\n[... {dropped} characters ...]\n{text[-half:]}"
    return html.escape(text)


def _output(out: dict[str, Any]) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        name = "stderr" if out.get("name") == "stderr" else "stdout"
        return f'<pre class="out {name}">{_text(out.get("text", ""))}</pre>'
    if kind == "error":
        trace = "\n".join(out.get("traceback") or [f"{out.get('ename')}: {out.get('evalue')}"])
        return f'<pre class="out error">{_text(trace)}</pre>'
    data = out.get("data") or {}
    for mime in _IMAGES:
        if mime in data:
            raw = "".join(data[mime]) if isinstance(data[mime], list) else str(data[mime])
            b64 = re.sub(r"\s+", "", raw)
            return f'<img class="out plot" alt="plot" src="data:{mime};base64,{html.escape(b64)}">'
    if "image/svg+xml" in data:
        svg = _text(data["image/svg+xml"])  # escaped text, then encoded whole
        b64 = base64.b64encode(html.unescape(svg).encode()).decode()
        return f'<img class="out plot" alt="plot" src="data:image/svg+xml;base64,{b64}">'
    if "text/html" in data:
        doc = html.escape(_raw(data["text/html"])[:LIVE_PAGE_TEXT_CHARS], quote=True)
        return f'<iframe class="out html" sandbox="" srcdoc="{doc}"></iframe>'
    if "text/markdown" in data:
        return f'<div class="out md">{_markdown(_raw(data["text/markdown"]))}</div>'
    if "text/plain" in data:
        return f'<pre class="out">{_text(data["text/plain"])}</pre>'
    return ""


def _raw(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def render_cell(cell: dict[str, Any], index: int) -> str:
    """One cell as an HTML fragment (``<section class="cell ...">``)."""
    meta = (cell.get("metadata") or {}).get(META_KEY) or {}
    kind = str(meta.get("kind") or cell.get("cell_type", "code"))
    css = re.sub(r"[^a-z_-]", "", kind.lower()) or "code"
    source = _raw(cell.get("source", ""))
    if cell.get("cell_type") == "markdown":
        role = meta.get("role")
        label = f'<div class="role">{html.escape(str(role))}</div>' if role else ""
        body = _markdown(source[:LIVE_PAGE_TEXT_CHARS])
        return f'<section class="cell md {css}" data-index="{index}">{label}{body}</section>'
    count = cell.get("execution_count")
    prompt = f"[{count}]" if count is not None else "[ ]"
    outputs = "".join(_output(out) for out in cell.get("outputs") or [])
    return (
        f'<section class="cell code {css}" data-index="{index}">'
        f'<div class="prompt">{html.escape(prompt)}</div>'
        f'<pre class="source">{_text(source)}</pre>{outputs}</section>'
    )
