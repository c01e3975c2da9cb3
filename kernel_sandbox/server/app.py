"""The ASGI application of ``kernel-sandbox serve``.

Layers, outermost first: the browser rules (Host allow-list, Origin check, security
headers: :mod:`.browser`), the API-key check and CSRF token (every path, ``/docs`` and
``/mcp`` included: :mod:`.auth`; calls into an E2B sandbox carry its access token
instead), the per-key caps on requests and streams in flight, MCP's per-key session
cap, the body caps (413, and the JSON shape before parsing: :mod:`.limits`), then
FastAPI with ms-enclave's routes, the native ``/v1`` routes, E2B's API under ``/e2b``
and MCP's streamable HTTP endpoint at ``/mcp``.  A refused body is answered without
its content (422s name the field, never echo the input).  The lifespan starts the
tenancy (restart policy, pool, idle reaper) and MCP's session manager, and on a
graceful stop removes every sandbox.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp

from .. import __version__
from ..errors import SandboxError
from ..limits import MAX_422_ERRORS, MAX_422_TEXT
from . import docs, e2b, enclave, live, native, snapshots
from .auth import AuthMiddleware, Keyring
from .browser import BrowserGuard, allowed_hosts_for
from .deps import error_response
from .limits import BodyLimitMiddleware, KeyConcurrency
from .mcp_sessions import McpSessionCap
from .settings import ServerSettings
from .tenancy import Tenancy

__all__ = ["build_app"]

log = logging.getLogger(__name__)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    """A 422 that names what is wrong and where, without echoing the input back."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    detail = [
        {
            "type": str(error.get("type", ""))[:MAX_422_TEXT],
            "loc": [
                part if isinstance(part, int) else str(part)[:MAX_422_TEXT]
                for part in list(error.get("loc", ()))[:10]
            ],
            "msg": str(error.get("msg", ""))[:MAX_422_TEXT],
        }
        for error in errors[:MAX_422_ERRORS]
    ]
    if len(errors) > MAX_422_ERRORS:
        detail.append({"type": "more", "loc": [], "msg": f"{len(errors) - MAX_422_ERRORS} more"})
    return JSONResponse({"detail": detail}, status_code=422)


def build_app(settings: ServerSettings, *, mcp: bool = True) -> ASGIApp:
    """The whole server as one ASGI app (wrapped in the browser rules, auth and limits)."""
    tenancy = Tenancy(settings)
    keyring = Keyring(settings.api_keys)
    e2b_registry = e2b.make_registry(tenancy, settings)
    mcp_server: Any = None
    if mcp:
        from mcp.server.transport_security import TransportSecuritySettings

        from ..mcp import SessionSandboxes, build_mcp_server

        mcp_server = build_mcp_server(
            SessionSandboxes(tenancy, keyring), max_timeout=settings.max_timeout
        )
        mcp_routes = mcp_server.streamable_http_app(
            streamable_http_path="/mcp",
            # several workers or replicas: any of them answers any request, so no MCP
            # session lives in one process (a call names its sandbox, or gets the key's)
            stateless_http=tenancy.shared,
            host=settings.host,
            max_request_body_size=settings.max_request_bytes,
            session_idle_timeout=settings.idle_timeout or None,
            # the Host and Origin rules are the BrowserGuard's, the same on every path
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
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
        redoc_url=None,
    )

    app.state.tenancy = tenancy
    app.state.settings = settings
    app.state.keyring = keyring
    app.state.e2b = e2b_registry
    app.add_exception_handler(SandboxError, error_response)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(Exception, _unexpected)
    app.include_router(enclave.router)
    app.include_router(native.router)
    app.include_router(snapshots.router)
    app.include_router(live.router)
    app.include_router(docs.router)
    for router in e2b.routers:
        app.include_router(router)
    app.mount(e2b.SANDBOX_PREFIX.rstrip("/"), e2b.EnvdApp(e2b_registry, settings.max_request_bytes))
    if mcp_server is not None:
        app.router.routes.extend(mcp_routes)
    inner: ASGIApp = BodyLimitMiddleware(app, settings.max_request_bytes, settings.max_upload_bytes)
    if mcp_server is not None:
        idle = settings.idle_timeout or None
        inner = McpSessionCap(inner, settings.max_mcp_sessions_per_key, idle)
    inner = KeyConcurrency(
        inner,
        settings.max_calls_per_key,
        settings.max_streams_per_key,
        owner_of=e2b_registry.owner_of,
    )
    hosts = allowed_hosts_for(settings.host, settings.allowed_hosts)
    guarded = BrowserGuard(AuthMiddleware(inner, keyring, token_paths=(e2b.SANDBOX_PREFIX,)), hosts)
    if settings.workers > 1 or settings.replica:
        from .workers import WorkerHeader

        return WorkerHeader(guarded, replica=settings.replica)
    return guarded
