"""``/docs``: Swagger UI for the API, served by this server (no CDN).

The assets come from the ``swagger-ui-bundle`` package (Swagger UI, Apache-2.0), so
the page works on an air-gapped machine and loads nothing from elsewhere.  Open
``/docs?api_key=KEY`` once: the key becomes a session cookie (see :mod:`.auth`) and
leaves the address bar; the page holds no key, only the session's CSRF token, which
its "Try it out" requests send.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from ..errors import SandboxNotFoundError
from .deps import keep_key, page

__all__ = ["router"]

router = APIRouter(include_in_schema=False)
#: The files of Swagger UI the page uses (nothing else of the package is served).
ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
}

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>kernel-sandbox API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/docs/assets/favicon-32x32.png"></head><body><div id="swagger-ui"></div>
<script nonce="{{NONCE}}" src="/docs/assets/swagger-ui-bundle.js"></script>
<script nonce="{{NONCE}}">
"use strict";
const csrf = "{{CSRF}}";
window.ui = SwaggerUIBundle({
  url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
  requestInterceptor: r => { if (csrf) r.headers["X-CSRF-Token"] = csrf; return r; },
});
</script></body></html>"""


def _assets() -> Path:
    import swagger_ui_bundle

    return Path(swagger_ui_bundle.swagger_ui_path)


@router.get("/docs")
async def docs(request: Request) -> Response:
    """Swagger UI (``?api_key=`` is moved into the session cookie first)."""
    return keep_key(request, "/docs") or page(PAGE, request)


@router.get("/docs/assets/{name}")
async def asset(name: str) -> FileResponse:
    """One of Swagger UI's own files."""
    if name not in ASSETS:
        raise SandboxNotFoundError(f"no asset {name!r}")
    headers = {"cache-control": "public, max-age=86400"}
    return FileResponse(_assets() / name, media_type=ASSETS[name], headers=headers)
