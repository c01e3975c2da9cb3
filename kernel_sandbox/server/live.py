"""The live session page: ``/ui`` lists a key's sandboxes and sessions, and a session
opens as a notebook that grows while it runs.

Server-rendered HTML and one small inline script (no CDN, no framework): the page asks
``/ui/s/{id}/cells?version=N``, which answers as soon as the session's recorder moves
past version ``N`` (a long poll, at most ``LIVE_POLL_SECONDS`` seconds), with every cell rendered
by :mod:`.live_render` (escaped; HTML outputs in script-less sandboxed iframes).  A
recorded step shows on an open page within milliseconds of being recorded, whatever
the notebook's write-behind delay.  Interrupt is the API's own ``POST
/v1/sandboxes/{id}/interrupt``; downloads are the ``.ipynb`` (flushed first) and its
offline HTML export.

Same keys as the API: open ``/ui?api_key=KEY`` once; the page then keeps a signed
session (never the key) in an HttpOnly, SameSite=Strict cookie (see :mod:`.auth`) and
drops the key from the address bar; its interrupt button sends the session's CSRF
token.  A key sees only its own sandboxes and notebooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response

from ..errors import SandboxNotFoundError
from ..limits import LIVE_POLL_SECONDS
from ..notebook.cells import META_KEY
from ..notebook.export import export_notebook
from ..notebook.storage import read_notebook
from .deps import Key, Ten, keep_key, page
from .durable import Paused
from .live_page import LIST_PAGE, SESSION_PAGE
from .live_render import render_cell
from .tenancy import Lease, Tenancy

__all__ = ["router"]

router = APIRouter(prefix="/ui", tags=["live page"], include_in_schema=False)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@router.get("", response_class=HTMLResponse)
async def index(request: Request) -> Response:
    """The list page; ``?api_key=`` is moved into the session cookie and out of the URL."""
    return keep_key(request, "/ui") or page(LIST_PAGE, request)


@router.get("/list.json")
async def listing(ten: Ten, key: Key) -> dict[str, Any]:
    """This key's live sandboxes (paused ones too), and its finished sessions' notebooks."""
    now = time.time()
    live = [_row(lease, now) for lease in ten.owned(key)]
    live += [_paused_row(paused, now) for paused in ten.durable.paused_of(key)]
    ids = {row["id"] for row in live}
    stored = []
    folder = ten.settings.record_dir / key
    if folder.is_dir():
        for path in sorted(folder.glob("*.ipynb"), key=lambda p: -p.stat().st_mtime)[:200]:
            if path.stem not in ids:
                stat = path.stat()
                stored.append(
                    {"id": path.stem, "size": stat.st_size, "modified_s": now - stat.st_mtime}
                )
    return {"owner": key, "sandboxes": live, "sessions": stored}


def _row(lease: Lease, now: float) -> dict[str, Any]:
    sandbox = lease.sandbox
    session = lease.recorder.notebook_meta()
    return {
        "id": lease.id,
        "owner": lease.owner,
        "kind": lease.kind,
        "image": sandbox.image,
        "age_s": now - sandbox.created_at,
        "idle_s": time.monotonic() - lease.last_used,
        "state": "closed" if sandbox.closed else ("busy" if lease.busy else "idle"),
        "cells": lease.recorder.cell_count(),
        "status": session.get("status", "?"),
    }


def _paused_row(paused: Paused, now: float) -> dict[str, Any]:
    """A paused sandbox: no container, its state in a snapshot; any call resumes it."""
    snap = paused.snapshot
    return {
        "id": paused.id,
        "owner": paused.owner,
        "kind": "docker",
        "image": snap.image,
        "age_s": now - snap.created,
        "idle_s": now - snap.created,
        "state": "paused",
        "cells": snap.execution_count - 1,
        "status": f"paused ({snap.sizes.get('bytes', 0) // 1024} KiB)",
    }


@router.get("/s/{sandbox_id}", response_class=HTMLResponse)
async def session_page(sandbox_id: str, request: Request, ten: Ten, key: Key) -> Response:
    """One session as a notebook page (it fills and grows through ``cells``)."""
    _source(ten, key, sandbox_id)  # 404 for another key's or an unknown id
    kept = keep_key(request, f"/ui/s/{sandbox_id}")
    return kept or page(SESSION_PAGE.replace("{{ID}}", html.escape(sandbox_id)), request)


@router.get("/s/{sandbox_id}/cells")
async def cells(sandbox_id: str, ten: Ten, key: Key, version: int = -2) -> JSONResponse:
    """Every cell as HTML once the session moved past ``version`` (or after a wait)."""
    lease, path = _source(ten, key, sandbox_id)
    if lease is None:
        nb = await asyncio.to_thread(read_notebook, path)
        rendered = [render_cell(cell, i) for i, cell in enumerate(nb.cells)]
        status = str(nb.metadata.get(META_KEY, {}).get("status", "?"))
        return JSONResponse(
            {"version": -1, "cells": rendered, "status": status, "state": "ended"},
            headers=_NO_STORE,
        )
    recorder = lease.recorder
    if recorder.version == version:
        await _changed(recorder, version)
    current = recorder.version
    nb = recorder.notebook
    rendered = [render_cell(cell, i) for i, cell in enumerate(nb.cells)]
    running = lease.running
    if running is not None:  # the call running now, with its outputs so far
        pending = {"cell_type": "code", "source": running["code"]}
        cell = {**pending, "outputs": list(running["outputs"]), "execution_count": "*"}
        rendered.append(
            render_cell(cell, len(rendered)).replace('class="cell', 'class="cell running', 1)
        )
    return JSONResponse(
        {
            "version": current,
            "cells": rendered,
            "status": str(nb.metadata.get(META_KEY, {}).get("status", "?")),
            "state": "busy" if lease.busy else "idle",
            "image": lease.sandbox.image,
        },
        headers=_NO_STORE,
    )


async def _changed(recorder: Any, version: int) -> None:
    """Wait until ``recorder`` moves past ``version`` (or ``LIVE_POLL_SECONDS`` seconds)."""
    loop = asyncio.get_running_loop()
    moved = asyncio.Event()

    def wake() -> None:  # called by the recording thread
        loop.call_soon_threadsafe(moved.set)

    recorder.watch(wake)
    try:
        if recorder.version == version:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), LIVE_POLL_SECONDS)
    finally:
        recorder.unwatch(wake)


@router.get("/s/{sandbox_id}/notebook.ipynb")
async def download_ipynb(sandbox_id: str, ten: Ten, key: Key) -> FileResponse:
    """The session's notebook as recorded so far (pending steps written first)."""
    lease, path = _source(ten, key, sandbox_id)
    if lease is not None:
        await asyncio.to_thread(lease.recorder.flush)
    return FileResponse(path, media_type="application/x-ipynb+json", filename=f"{sandbox_id}.ipynb")


@router.get("/s/{sandbox_id}/notebook.html")
async def download_html(sandbox_id: str, ten: Ten, key: Key) -> Response:
    """The session as one offline HTML file (nbconvert, images embedded)."""
    lease, path = _source(ten, key, sandbox_id)
    if lease is not None:
        await asyncio.to_thread(lease.recorder.flush)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{sandbox_id}.html"
        await asyncio.to_thread(export_notebook, path, "html", out)
        body = out.read_bytes()
    return Response(
        body,
        media_type="text/html",
        headers={"content-disposition": f'attachment; filename="{sandbox_id}.html"'},
    )


def _source(ten: Tenancy, key: str, sandbox_id: str) -> tuple[Lease | None, Path]:
    """The live lease (or None) and the notebook path of one of ``key``'s sessions."""
    if not _NAME.match(sandbox_id):
        raise SandboxNotFoundError(f"no session {sandbox_id!r} for this API key")
    with contextlib.suppress(SandboxNotFoundError):
        lease = ten.get(key, sandbox_id)
        return lease, lease.notebook_path
    path = ten.settings.record_dir / key / f"{sandbox_id}.ipynb"
    if not path.is_file():
        raise SandboxNotFoundError(f"no session {sandbox_id!r} for this API key")
    return None, path


_NO_STORE = {"cache-control": "no-store"}
