"""Request limits: what one request, and one key's requests together, may cost.

Bodies past their cap are refused with 413, never buffered: a declared
``Content-Length`` over the cap is refused before the body is read, a chunked body is
counted as it arrives and cut off at the cap.  File uploads, tar archives and bodies
that are not one JSON document stream on, counted; every JSON body (the routes'
bodies, JSON-RPC for ``/mcp``) is read whole within ``max_request_bytes`` and its shape
checked *before* anything parses it (:func:`~kernel_sandbox.limits.json_shape_error`):
parsing is where a small body becomes a large cost.  Past the body,
:class:`KeyConcurrency` caps the requests and the event streams one key has in flight
(429, with the setting to change).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..limits import DRAIN_BYTES, MAX_BODY_BYTES_PER_KEY, json_shape_error
from ..threads import owned_by

__all__ = [
    "BodyLimitMiddleware",
    "KeyConcurrency",
    "is_stream",
    "is_upload_path",
    "send_json_error",
]

_UPLOAD = re.compile(r"^/(v1/sandboxes/[^/]+/file|sandbox/[^/]+/archive|e2b/sandbox/files)$")
_TRUE = frozenset({"1", "true", "on", "yes"})
#: envd's Connect routes, whose clients read errors in Connect's shape only.
_CONNECT = re.compile(r"^/e2b/sandbox/(process\.Process|filesystem\.Filesystem)/")
#: A middleware's status as Connect's code, and the HTTP status Connect gives that code.
_CONNECT_ERRORS = {
    401: ("unauthenticated", 401),
    403: ("permission_denied", 403),
    413: ("resource_exhausted", 429),
    429: ("resource_exhausted", 429),
}


def is_upload_path(path: str) -> bool:
    """Routes whose body is a file (the larger cap applies, and it streams)."""
    return bool(_UPLOAD.match(path))


def _json_or_none(scope: Scope) -> bool:
    """Whether a body will be parsed as one JSON document: no type, ``application/json``
    or ``application/*+json`` (what FastAPI parses as JSON), but not a Connect stream
    (``application/connect+json``, a sequence of messages); anything else (a file,
    text) is passed on as it arrives, counted against the cap."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-type":
            media: bytes = value.split(b";")[0].strip().lower()
            if media.startswith(b"application/connect+"):
                return False
            return media == b"application/json" or (
                media.startswith(b"application/") and media.endswith(b"+json")
            )
    return True


def is_stream(scope: Scope) -> bool:
    """Whether a request opens an event stream: a ``?stream=true`` call, MCP's GET, the
    E2B code interpreter's ``/execute`` and envd's streaming Connect calls (a process's
    output, a directory watch: ``application/connect+...``)."""
    path = scope["path"].rstrip("/")
    if scope["method"] == "GET" and path == "/mcp":
        return True
    if path == "/e2b/sandbox/execute":
        return True
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-type" and value.lower().startswith(b"application/connect+"):
            return True
    if b"stream=" not in scope.get("query_string", b""):
        return False
    query = parse_qs(scope["query_string"].decode("latin-1"))
    return any(v.lower() in _TRUE for v in query.get("stream", []))


async def _drain(receive: Receive) -> None:
    drained = 0
    while drained <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return
        drained += len(message.get("body", b""))


async def send_json_error(
    send: Send,
    status: int,
    detail: str,
    headers: list[tuple[bytes, bytes]],
    scope: Scope | None = None,
) -> None:
    """Answer ``{"detail": ...}`` with ``status`` from a raw ASGI middleware (before any
    route runs), with ``headers`` besides its type and length.  Under ``/e2b/`` (the
    request's ``scope``) the answer is E2B's own shape, ``{"code": status, "message":
    ...}``, which E2B's SDK reads (it fails on any other); on envd's Connect routes it is
    Connect's, ``{"code": "resource_exhausted", "message": ...}`` at Connect's status."""
    path = "" if scope is None else str(scope.get("path", ""))
    if _CONNECT.match(path) and status in _CONNECT_ERRORS:
        code, status = _CONNECT_ERRORS[status]
        body = json.dumps({"code": code, "message": detail}).encode()
    elif path.startswith("/e2b/"):
        body = json.dumps({"code": status, "message": detail}).encode()
    else:
        body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_413(send: Send, limit: int, scope: Scope) -> None:
    detail = f"request body larger than {limit} bytes; the server's cap refuses it"
    await send_json_error(send, 413, detail, [(b"connection", b"close")], scope)


class BodyLimitMiddleware:
    """Enforces the body caps of :class:`~.settings.ServerSettings` and the JSON shape."""

    def __init__(
        self,
        app: ASGIApp,
        max_request_bytes: int,
        max_upload_bytes: int,
        max_key_bytes: int = MAX_BODY_BYTES_PER_KEY,
    ) -> None:
        self.app = app
        self.max_request = max_request_bytes
        self.max_upload = max_upload_bytes
        self.max_key_bytes = max(max_key_bytes, max_request_bytes)
        #: Bytes of bodies each key has read in and not yet done with.
        self.held: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = is_upload_path(scope["path"])
        limit = self.max_upload if upload else self.max_request
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = limit + 1
                if declared > limit:
                    await _drain(receive)
                    await _send_413(send, limit, scope)
                    return
        if upload or not _json_or_none(scope):
            await self._streamed(scope, receive, send, limit)
        else:
            await self._whole(scope, receive, send, limit)

    async def _whole(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Read the body within ``limit`` (and the key's budget), check its shape, then
        hand it on in one piece; the budget is given back when the response ends."""
        key = str(scope.get("state", {}).get("key_id", ""))
        buffer = bytearray()  # grows in place: a refused body never exists twice
        taken = 0
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away before its body was whole
                chunk = message.get("body", b"")
                buffer += chunk
                taken += len(chunk)
                self.held[key] += len(chunk)
                if len(buffer) > limit or self.held[key] > self.max_key_bytes:
                    if message.get("more_body"):
                        await _drain(receive)
                    if len(buffer) > limit:
                        await _send_413(send, limit, scope)
                    else:
                        await _send_429(send, scope, self._busy)
                    return
                if not message.get("more_body"):
                    break
            problem = json_shape_error(buffer)
            if problem is not None:
                detail = f"{problem}; the server refuses it unparsed (send a smaller body)"
                await send_json_error(send, 413, detail, [], scope)
                return
            body = bytes(buffer)
            buffer.clear()  # the one copy left is the app's
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.held[key] -= taken
            if self.held[key] <= 0:
                del self.held[key]

    @property
    def _busy(self) -> str:
        return (
            f"this API key is sending more than {self.max_key_bytes} bytes of request bodies "
            "at once (MAX_BODY_BYTES_PER_KEY); send them one after another, or upload files "
            "through the file routes"
        )

    async def _streamed(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Pass the body on as it arrives, answering 413 once it passes ``limit``."""
        seen = 0
        over = False
        answered = False

        async def counted_receive() -> Message:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True  # the app sees a client that went away; we answer 413
                    if message.get("more_body"):
                        await _drain(receive)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if over:
                if not answered:
                    answered = True
                    await _send_413(send, limit, scope)
                return
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not answered:
            await _send_413(send, limit, scope)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` in one message, then what the client sends."""
    given = False

    async def replay() -> Message:
        nonlocal given, body
        if given:
            return await receive()
        given = True
        message: Message = {"type": "http.request", "body": body, "more_body": False}
        body = b""
        return message

    return replay


class KeyConcurrency:
    """Caps what one key has in flight: requests (``max_calls``) and, among them, event
    streams (``max_streams``).  Past either the request gets a 429 that names the
    setting; the count is released when the response ends or the client leaves.

    A request without a key id (a call into an E2B sandbox, which carries the sandbox's
    access token instead) counts against the key ``owner_of`` names for it: the owner
    of the sandbox it is for, so every route shares the same caps.  Each request runs
    :func:`~kernel_sandbox.threads.owned_by` its key: its blocking calls (engine calls,
    commands, file transfers) take that key's worker threads, never another key's.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_calls: int,
        max_streams: int,
        owner_of: Callable[[Scope], str | None] | None = None,
    ) -> None:
        self.app = app
        self.max_calls = max_calls
        self.max_streams = max_streams
        self.owner_of = owner_of
        self.calls: Counter[str] = Counter()
        self.streams: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = scope.get("state", {}).get("key_id")  # set by the auth middleware
        if key is None and self.owner_of is not None:
            key = self.owner_of(scope)  # a call into an E2B sandbox: its owner's caps
        if key is None:  # no sandbox of anyone's: the route answers 404 at once
            await self.app(scope, receive, send)
            return
        stream = is_stream(scope)
        if self.calls[key] >= self.max_calls:
            await _send_429(
                send,
                scope,
                f"this API key has {self.max_calls} requests in flight, the server's cap "
                "(--max-calls-per-key); wait for one to end, or ask the operator to raise it",
            )
            return
        if stream and self.streams[key] >= self.max_streams:
            await _send_429(
                send,
                scope,
                f"this API key has {self.max_streams} event streams open, the server's cap "
                "(--max-streams-per-key); close one (or call without ?stream=true)",
            )
            return
        self.calls[key] += 1
        self.streams[key] += stream
        try:
            with owned_by(key):  # its blocking calls on its own threads (see threads.py)
                await self.app(scope, receive, send)
        finally:
            self.calls[key] -= 1
            self.streams[key] -= stream
            if not self.calls[key]:
                del self.calls[key]
            if not self.streams[key]:
                del self.streams[key]


async def _send_429(send: Send, scope: Scope, detail: str) -> None:
    await send_json_error(send, 429, detail, [(b"retry-after", b"1")], scope)
