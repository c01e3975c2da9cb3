"""API keys: who is calling.  Each key is one tenant, known by its key id.

A key is accepted as ``X-API-Key`` (what ms-enclave's client sends),
``Authorization: Bearer``, or the ``api_key`` query parameter (as ms-enclave's server
accepts it; it lets a browser open ``/ui?api_key=...`` or ``/docs?api_key=...``).
Those two pages then trade the key for a *session cookie* (HttpOnly, SameSite=Strict):
an HMAC-signed session id that names the key id and an expiry, signed with the key's
own digest, so the cookie never holds the key, any replica with the same keys accepts
it, and removing a key ends its sessions.  A request the cookie alone authenticates
must carry the session's CSRF token (``X-CSRF-Token``) to change anything.

The key id (a hash prefix) is what the server stores in labels, notebook paths and
logs: never the key.  The check is an ASGI middleware in front of *everything*
(``/docs``, ``/openapi.json`` and ``/mcp`` included), so no route can forget it; it
also hands the MCP SDK the key id as the request's user, so an MCP session answers
only the key that opened it.

The one exception is named when the app is built: calls *into* an E2B sandbox
(``/e2b/sandbox/...``) carry E2B's per-sandbox envd access token instead of a key,
and :mod:`.e2b.state` checks that token on every one of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Literal
from urllib.parse import parse_qs

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.types import ASGIApp, Receive, Scope, Send

from ..limits import SESSION_TTL
from .limits import send_json_error

__all__ = [
    "ANONYMOUS",
    "COOKIE",
    "CSRF_HEADER",
    "AuthMiddleware",
    "Credential",
    "Keyring",
    "csrf_token_of",
    "key_id",
    "lower_headers",
    "principal_of",
    "read_credential",
]

#: The session cookie of the live page and the docs (see :meth:`Keyring.new_session`).
COOKIE = "ks_session"
#: The header that carries a cookie session's CSRF token on a state change.
CSRF_HEADER = "x-csrf-token"
#: The tenant of a server started without keys (loopback only).
ANONYMOUS = "anonymous"
#: Methods that change nothing; anything else needs the CSRF token under a cookie.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def key_id(key: str) -> str:
    """A stable, non-secret name of a key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Credential:
    """What a request presented: a key (header or query) or a session cookie."""

    value: str
    via: Literal["header", "query", "cookie"]


def read_credential(headers: Mapping[str, str], query_string: bytes = b"") -> Credential | None:
    """The one place that reads a request's credential (header names lower-case).

    An explicit key beats an ambient one: ``X-API-Key``, then ``Authorization:
    Bearer``, then ``?api_key=``, and only then the session cookie, so a wrong key in
    the address is refused instead of riding on a valid cookie.
    """
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    if given is not None:
        return Credential(given, "header")
    if b"api_key=" in query_string:
        query = parse_qs(query_string.decode("latin-1"))
        if query.get("api_key"):
            return Credential(query["api_key"][0], "query")
    if COOKIE in headers.get("cookie", ""):
        cookie = SimpleCookie()
        with contextlib.suppress(CookieError):
            cookie.load(headers["cookie"])
        if COOKIE in cookie and cookie[COOKIE].value:
            return Credential(cookie[COOKIE].value, "cookie")
    return None


class Keyring:
    """The accepted keys: who a credential is, and the sessions signed for each key."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = {hashlib.sha256(k.encode()).digest(): key_id(k) for k in keys if k}
        self._by_id = {kid: digest for digest, kid in self._digests.items()}

    @property
    def enabled(self) -> bool:
        """Whether keys are required at all."""
        return bool(self._digests)

    def identify(self, headers: Mapping[str, str], query_string: bytes = b"") -> str | None:
        """The caller's key id, ``ANONYMOUS`` without keys, None when refused."""
        if not self._digests:
            return ANONYMOUS
        credential = read_credential(headers, query_string)
        return None if credential is None else self.check(credential)

    def identify_scope(self, scope: Scope) -> str | None:
        """:meth:`identify` for an ASGI request: its headers, query and cookie, read by
        :func:`read_credential` as the middleware reads them (the MCP tools use it)."""
        return self.identify(lower_headers(scope), scope.get("query_string", b""))

    def check(self, credential: Credential) -> str | None:
        """The key id ``credential`` proves, or None."""
        if credential.via == "cookie":
            return self._session_key(credential.value)
        digest = hashlib.sha256(credential.value.encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, kid in self._digests.items():  # constant time per key
            if hmac.compare_digest(known, digest):
                found = kid
        return found

    def new_session(self, kid: str, ttl: float = SESSION_TTL) -> str:
        """A session cookie value for key id ``kid``: ``kid.expiry.nonce.signature``."""
        body = f"{kid}.{int(time.time() + ttl)}.{secrets.token_hex(12)}"
        return f"{body}.{self._sign(kid, body)}"

    def csrf_token(self, session: str) -> str | None:
        """The CSRF token that goes with a valid session cookie (None for a bad one)."""
        kid = self._session_key(session)
        return None if kid is None else self._sign(kid, "csrf:" + session)

    def _sign(self, kid: str, message: str) -> str:
        return hmac.new(self._by_id[kid], message.encode(), hashlib.sha256).hexdigest()[:32]

    def _session_key(self, session: str) -> str | None:
        kid, _, rest = session.partition(".")
        expiry, _, rest = rest.partition(".")
        body, _, mac = session.rpartition(".")
        if kid not in self._by_id or not expiry.isdigit() or int(expiry) < time.time():
            return None
        return kid if hmac.compare_digest(self._sign(kid, body), mac) else None


def lower_headers(scope: Scope) -> dict[str, str]:
    """A request's headers as text, names lower-cased (the last of a repeated one)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def principal_of(scope: Scope) -> str:
    """The key id the middleware stored for this request."""
    return str(scope.get("state", {}).get("key_id", ANONYMOUS))


def csrf_token_of(scope: Scope) -> str:
    """The CSRF token of the request's cookie session ("" without one)."""
    return str(scope.get("state", {}).get("csrf", ""))


class AuthMiddleware:
    """Answers 401 to any HTTP or WebSocket request without a valid key, and 403 to a
    state change that only a cookie authenticates without its CSRF token."""

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
        headers = lower_headers(scope)
        state = scope.setdefault("state", {})
        credential = read_credential(headers, scope.get("query_string", b""))
        if not self.keyring.enabled:
            kid: str | None = ANONYMOUS
            credential = None
        else:
            kid = None if credential is None else self.keyring.check(credential)
        if kid is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4401})
                return
            await send_json_error(
                send,
                401,
                "missing or wrong API key: send X-API-Key or Authorization: Bearer",
                [(b"www-authenticate", b'Bearer realm="kernel-sandbox"')],
                scope,
            )
            return
        if credential is not None and credential.via == "cookie":
            token = self.keyring.csrf_token(credential.value) or ""
            state["csrf"] = token
            given = headers.get(CSRF_HEADER, "")
            if scope.get("method", "GET") not in SAFE_METHODS and not (
                given and hmac.compare_digest(given, token)
            ):
                await send_json_error(
                    send,
                    403,
                    "a change authenticated only by the session cookie needs its CSRF token "
                    "(X-CSRF-Token, as the live page sends it); API clients send X-API-Key",
                    [],
                    scope,
                )
                return
        state["key_id"] = kid
        state["auth_via"] = credential.via if credential is not None else "none"
        # the MCP SDK binds each session to the user that opened it (404 to any other)
        access = AccessToken(token="", client_id=kid, scopes=[])
        scope["user"] = AuthenticatedUser(access)
        await self.app(scope, receive, send)
