"""Request size limits: bodies past their cap are refused with 413, never buffered.

A declared ``Content-Length`` over the cap is refused before the body is read; a
chunked body is counted as it arrives and cut off at the cap.  File uploads and tar
archives get ``max_upload_bytes``, everything else ``max_request_bytes``.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimitMiddleware", "is_upload_path", "send_json_error"]

_UPLOAD = re.compile(r"^/(v1/sandboxes/[^/]+/file|sandbox/[^/]+/archive|e2b/sandbox/files)$")


def is_upload_path(path: str) -> bool:
    """Routes whose body is a file (the larger cap applies)."""
    return bool(_UPLOAD.match(path))


#: Bytes of a refused body read and thrown away, so that the client, still sending,
#: reads the 413 instead of a reset connection; past this the connection just closes.
DRAIN_BYTES = 64 * 1024 * 1024


async def _drain(receive: Receive) -> None:
    drained = 0
    while drained <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return
        drained += len(message.get("body", b""))


async def send_json_error(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]]
) -> None:
    """Answer ``{"detail": ...}`` with ``status`` from a raw ASGI middleware (before any
    route runs), with ``headers`` besides its type and length."""
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


async def _send_413(send: Send, limit: int) -> None:
    detail = f"request body larger than {limit} bytes; the server's cap refuses it"
    await send_json_error(send, 413, detail, [(b"connection", b"close")])


class BodyLimitMiddleware:
    """Enforces the body caps of :class:`~.settings.ServerSettings`."""

    def __init__(self, app: ASGIApp, max_request_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_request = max_request_bytes
        self.max_upload = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_upload if is_upload_path(scope["path"]) else self.max_request
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = limit + 1
                if declared > limit:
                    await _drain(receive)
                    await _send_413(send, limit)
                    return
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
                    await _send_413(send, limit)
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
            await _send_413(send, limit)
