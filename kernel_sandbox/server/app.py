"""The ASGI application of ``kernel-sandbox serve``.

Layers, outermost first: the API-key check (every path, ``/docs`` and ``/mcp``
included; calls into an E2B sandbox carry its access token instead), the body caps
(413), then FastAPI with ms-enclave's routes, the native ``/v1`` routes, E2B's API
under ``/e2b`` and MCP's streamable HTTP endpoint at ``/mcp``.  The lifespan starts
the tenancy (restart policy, pool, idle reaper) and MCP's session manager, and on a
graceful stop removes every sandbox.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp

from .. import __version__
from ..errors import SandboxError
from . import e2b, enclave, live, native, snapshots
from .auth import AuthMiddleware, Keyring
from .deps import error_response
from .limits import BodyLimitMiddleware
from .settings import ServerSettings
from .tenancy import Tenancy

__all__ = ["build_app"]

log = logging.getLogger(__name__)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)


def build_app(settings: ServerSettings, *, mcp: bool = True) -> ASGIApp:
    """The whole server as one ASGI app (wrapped in auth and size limits)."""
    tenancy = Tenancy(settings)
    keyring = Keyring(settings.api_keys)
    e2b_registry = e2b.make_registry(tenancy, settings)
    mcp_server: Any = None
    if mcp:
        from ..mcp import SessionSandboxes, build_mcp_server

        mcp_server = build_mcp_server(
            SessionSandboxes(tenancy, keyring), max_timeout=settings.max_timeout
        )
        mcp_routes = mcp_server.streamable_http_app(
            streamable_http_path="/mcp",
            host=settings.host,
            max_request_body_size=settings.max_request_bytes,
            session_idle_timeout=settings.idle_timeout or None,
        ).routes

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await tenancy.start()
        e2b_registry.start()
        try:
            if mcp_server is not None:
                async with mcp_server.session_manager.run():
                    yield
            else:
                yield
        finally:
            await e2b_registry.stop()
            await tenancy.stop()

    app = FastAPI(
        title="kernel-sandbox",
        version=__version__,
        description="Stateful Python sandboxes: ms-enclave's REST API, a native streaming "
        "API under /v1 and MCP at /mcp. Every route needs the API key (X-API-Key or "
        "Authorization: Bearer) when the server has one.",
        lifespan=lifespan,
        docs_url=None,
    )

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        """Swagger UI; with ``?api_key=`` the page fetches the document with it too."""
        key = request.query_params.get("api_key")
        url = "/openapi.json" + (f"?{urlencode({'api_key': key})}" if key else "")
        return get_swagger_ui_html(openapi_url=url, title="kernel-sandbox API")

    app.state.tenancy = tenancy
    app.state.settings = settings
    app.state.e2b = e2b_registry
    app.add_exception_handler(SandboxError, error_response)
    app.add_exception_handler(Exception, _unexpected)
    app.include_router(enclave.router)
    app.include_router(native.router)
    app.include_router(snapshots.router)
    app.include_router(live.router)
    for router in e2b.routers:
        app.include_router(router)
    app.mount(e2b.SANDBOX_PREFIX.rstrip("/"), e2b.EnvdApp(e2b_registry, settings.max_request_bytes))
    if mcp_server is not None:
        app.router.routes.extend(mcp_routes)
    limited = BodyLimitMiddleware(app, settings.max_request_bytes, settings.max_upload_bytes)
    return AuthMiddleware(limited, keyring, token_paths=(e2b.SANDBOX_PREFIX,))
