"""What a web browser may make the server do: the Host allow-list, the Origin check and
the security headers of every response.

A browser is the one client that acts for someone else: any page it shows can send
requests here.  Three rules keep those pages out:

- **Host allow-list** (421): a request must name an allowed host.  A keyless server on
  loopback allows only loopback names by default, which defeats DNS rebinding (a page
  of ``evil.example`` whose name then resolves to 127.0.0.1 sends ``Host:
  evil.example``).  ``--allowed-host`` widens or sets it; ``*`` allows any.
- **Origin check** (403): a request that carries an ``Origin`` (browsers send it on
  every cross-origin request and every non-GET one) must come from this very origin,
  host *and* port, so another port on the same machine (the same *site*, which
  SameSite cookies do not separate) is refused too.  Clients that are not browsers
  send no ``Origin`` and are not affected.
- **Headers**: ``nosniff``, no framing (``frame-ancestors 'none'``) and a closed CSP on
  every response; pages (``/ui``, ``/docs``) send their own CSP with a nonce for their
  one script.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .limits import send_json_error
from .settings import is_loopback

__all__ = ["LOOPBACK_NAMES", "BrowserGuard", "allowed_hosts_for", "page_csp"]

#: Host names a loopback-bound server answers to by default.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: Whatever a response says about itself, a browser must not guess another type or
#: show it in someone else's frame.
_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
_API_CSP = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'"


def page_csp(nonce: str) -> str:
    """The CSP of an HTML page whose only script carries ``nonce``."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    )


def allowed_hosts_for(bind: str, configured: Iterable[str]) -> tuple[str, ...]:
    """The host patterns a server bound to ``bind`` answers to: the configured ones, or
    for a loopback bind (nothing configured) the loopback names; otherwise any."""
    hosts = tuple(h.strip().lower() for h in configured if h.strip())
    if hosts:
        return hosts
    if is_loopback(bind):
        return tuple(dict.fromkeys((*LOOPBACK_NAMES, bind.strip("[]").lower())))
    return ("*",)


def _split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` (IPv6 in brackets) as a lower-case name and a port."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return name, int(port) if port.isdigit() else None


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class BrowserGuard:
    """The three rules above, in front of everything (before the key is checked)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = tuple(allowed_hosts)

    def _host_ok(self, name: str) -> bool:
        return any(fnmatch(name, pattern) for pattern in self.allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = origin = None
        for key, value in scope.get("headers", []):
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        refusal = self._refusal(scope, host, origin)
        if refusal is not None:
            status, detail = refusal
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4403})
            else:
                await send_json_error(send, status, detail, _HEADERS)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [h for h in _HEADERS if h[0] not in names]
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", _API_CSP))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, guarded_send)

    def _refusal(
        self, scope: Scope, host: str | None, origin: str | None
    ) -> tuple[int, str] | None:
        name, port = _split_host(host or "")
        if host is not None and not self._host_ok(name):
            return 421, (
                f"this server does not answer to the host {name[:100]!r} (a page may be "
                "rebinding a name to it); start it with --allowed-host NAME to serve that name"
            )
        if origin is None:
            return None
        parts = urlsplit(origin.strip().lower())
        try:
            origin_port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
        except ValueError:  # not a port number
            origin_port = -1
        if port is None:
            port = origin_port  # a proxy in front may keep the Host header without its port
        if origin == "null" or parts.hostname != name or origin_port != port:
            return 403, (
                f"cross-origin request refused: Origin {origin[:100]!r} is not this server "
                "(browsers may call it only from its own pages; other clients send no Origin)"
            )
        return None
