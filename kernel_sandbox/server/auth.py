"""API keys: who is calling.  Each key is one tenant, known by its key id.

A key is accepted as ``X-API-Key`` (what ms-enclave's client sends),
``Authorization: Bearer``, or the ``api_key`` query parameter (as ms-enclave's server
accepts it; it lets a browser open ``/docs?api_key=...``), or the ``ks_api_key`` cookie
that ``/ui?api_key=...`` sets (HttpOnly, SameSite=Strict) for the live page.  The key id (a hash
prefix) is what the server stores in labels, notebook paths and logs: never the key.
The check is an ASGI middleware in front of *everything* (``/docs``,
``/openapi.json`` and ``/mcp`` included), so no route can forget it.  The one
exception is named when the app is built: calls *into* an E2B sandbox
(``/e2b/sandbox/...``) carry E2B's per-sandbox envd access token instead of a key,
and :mod:`.e2b.state` checks that token on every one of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Iterable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from .limits import send_json_error

__all__ = [
    "ANONYMOUS",
    "COOKIE",
    "AuthMiddleware",
    "Keyring",
    "key_headers",
    "key_id",
    "principal_of",
]

#: The cookie the live page (``/ui``) keeps the key in, once opened with ``?api_key=``.
COOKIE = "ks_api_key"
#: The tenant of a server started without keys (loopback only).
ANONYMOUS = "anonymous"


def key_id(key: str) -> str:
    """A stable, non-secret name of a key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Keyring:
    """The accepted keys; ``identify`` maps request headers to a key id (or None)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = {hashlib.sha256(k.encode()).digest(): key_id(k) for k in keys if k}

    @property
    def enabled(self) -> bool:
        """Whether keys are required at all."""
        return bool(self._digests)

    def identify(self, headers: dict[str, str]) -> str | None:
        """The caller's key id, ``ANONYMOUS`` without keys, None when refused."""
        if not self._digests:
            return ANONYMOUS
        given = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if given is None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given:
            return None
        digest = hashlib.sha256(given.encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, kid in self._digests.items():  # constant time per key
            if hmac.compare_digest(known, digest):
                found = kid
        return found


def key_headers(scope: Scope) -> dict[str, str]:
    """A request's headers (lower-cased names) with its key, wherever it came, as
    ``x-api-key``: the one reading of the key for every route (the middleware and the
    MCP tools alike), so a key that opens one door opens them all."""
    headers = {
        k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
    }
    if "x-api-key" not in headers and "authorization" not in headers:
        # the live page (/ui) keeps the key in an HttpOnly, SameSite=Strict cookie
        cookie = SimpleCookie()
        with contextlib.suppress(CookieError):
            cookie.load(headers.get("cookie", ""))
        if COOKIE in cookie and cookie[COOKIE].value:
            headers["x-api-key"] = cookie[COOKIE].value
    if "x-api-key" not in headers and b"api_key=" in scope.get("query_string", b""):
        query = parse_qs(scope["query_string"].decode("latin-1"))
        if query.get("api_key"):
            headers["x-api-key"] = query["api_key"][0]
    return headers


def principal_of(scope: Scope) -> str:
    """The key id the middleware stored for this request."""
    return str(scope.get("state", {}).get("key_id", ANONYMOUS))


class AuthMiddleware:
    """Answers 401 to any HTTP or WebSocket request without a valid key."""

    def __init__(self, app: ASGIApp, keyring: Keyring, token_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self.keyring = keyring
        #: Path prefixes whose routes check a per-sandbox token themselves, not a key.
        self.token_paths = token_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or (
            self.token_paths and scope["path"].startswith(self.token_paths)
        ):
            await self.app(scope, receive, send)
            return
        kid = self.keyring.identify(key_headers(scope))
        if kid is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4401})
                return
            await send_json_error(
                send,
                401,
                "missing or wrong API key: send X-API-Key or Authorization: Bearer",
                [(b"www-authenticate", b'Bearer realm="kernel-sandbox"')],
            )
            return
        scope.setdefault("state", {})["key_id"] = kid
        await self.app(scope, receive, send)
