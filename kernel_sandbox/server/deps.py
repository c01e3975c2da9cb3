"""What every route needs: the tenancy, the caller's key id, errors as status codes,
and for the pages a session cookie and a CSP.

The dependencies are ``async def`` though they never wait: FastAPI runs a plain
``def`` dependency in a worker thread, three thread hops on every request.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ..errors import (
    CapacityError,
    ConfigError,
    ContextNotFoundError,
    EngineUnavailableError,
    FileOperationError,
    FileOperationTimeoutError,
    ImageError,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SnapshotError,
    SnapshotNotFoundError,
)
from ..limits import SESSION_TTL
from ..wire import dumps
from .auth import COOKIE, csrf_token_of, principal_of
from .browser import page_csp
from .settings import ServerSettings
from .tenancy import Tenancy

__all__ = [
    "Key",
    "Opts",
    "Ten",
    "error_response",
    "json_response",
    "keep_key",
    "owner",
    "page",
    "status_of",
    "tenancy",
]


async def tenancy(request: Request) -> Tenancy:
    """The server's tenancy (one per app)."""
    return request.app.state.tenancy  # type: ignore[no-any-return]


async def settings(request: Request) -> ServerSettings:
    """The server's settings."""
    return request.app.state.settings  # type: ignore[no-any-return]


async def owner(request: Request) -> str:
    """The caller's key id (set by the auth middleware)."""
    return principal_of(request.scope)


def status_of(exc: SandboxError) -> int:
    """The HTTP status that says what went wrong (the client's part or the server's)."""
    if isinstance(
        exc,
        SandboxNotFoundError
        | SandboxFileNotFoundError
        | SnapshotNotFoundError
        | ContextNotFoundError,
    ):
        return 404
    if isinstance(exc, SnapshotError):
        return 409  # the sandbox's state cannot be saved or loaded as asked
    if isinstance(exc, CapacityError):
        return 429
    if isinstance(exc, FileOperationTimeoutError):
        return 504  # the sandbox did not answer in time: neither the client's fault nor ours
    if isinstance(exc, ConfigError | FileOperationError | ImageError | SandboxClosedError):
        return 400
    if isinstance(exc, EngineUnavailableError):
        return 503
    return 502  # the sandbox failed (did not start, engine refused): not the server's bug


def json_response(value: Any, status_code: int = 200) -> Response:
    """A finished JSON response: what a hot route returns instead of a dict, so that
    FastAPI neither walks it through ``jsonable_encoder`` nor validates it again."""
    return Response(dumps(value), status_code, media_type="application/json")


def error_response(request: Request, exc: Exception) -> JSONResponse:
    """A ``SandboxError`` as ``{"detail": ...}`` with its status."""
    assert isinstance(exc, SandboxError)
    return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))


#: Route parameter types: the tenancy, the settings and the caller's key id.
Ten = Annotated[Tenancy, Depends(tenancy)]
Opts = Annotated[ServerSettings, Depends(settings)]
Key = Annotated[str, Depends(owner)]


def keep_key(request: Request, path: str) -> Response | None:
    """With ``?api_key=``: a 303 to ``path`` that trades the key for a session cookie.

    The key was checked already (a wrong one is refused before any route, whatever
    cookie the browser holds); the cookie holds a signed session id, never the key.
    """
    if "api_key" not in request.query_params:
        return None
    response = RedirectResponse(path, status_code=303)
    keyring = request.app.state.keyring
    if keyring.enabled:
        response.set_cookie(
            COOKIE,
            keyring.new_session(principal_of(request.scope)),
            max_age=int(SESSION_TTL),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
    return response


def page(markup: str, request: Request) -> HTMLResponse:
    """An HTML page of this server: its one script gets a nonce, the CSRF token of the
    caller's session is filled in, and the CSP allows nothing else."""
    nonce = secrets.token_urlsafe(16)
    body = markup.replace("{{NONCE}}", nonce).replace("{{CSRF}}", csrf_token_of(request.scope))
    headers = {"cache-control": "no-store", "content-security-policy": page_csp(nonce)}
    return HTMLResponse(body, headers=headers)
