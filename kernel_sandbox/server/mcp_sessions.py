"""MCP sessions over HTTP: each bound to the key that opened it, and few per key.

The MCP SDK binds a session to the request's user (the auth middleware sets it to
the key id), so another key's ``mcp-session-id`` answers 404 as an unknown one would,
for POST, the GET stream and DELETE alike.  What the SDK does not bound is how many
sessions one key opens (its only cap is server-wide): :class:`McpSessionCap` counts
them per key, and a key that opens one more than ``max_per_key`` ends its own
longest-idle session first, through the SDK's own ``DELETE``, so no other key is ever
affected and nothing of the SDK's internals is touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["McpSessionCap"]

_SESSION = b"mcp-session-id"


def _session_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    return next((v.decode("latin-1") for k, v in headers if k == _SESSION), None)


class McpSessionCap:
    """In front of ``/mcp``: tracks each key's sessions and keeps them within the cap."""

    def __init__(
        self,
        app: ASGIApp,
        max_per_key: int,
        idle_timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.max_per_key = max_per_key
        self.idle_timeout = idle_timeout
        self.clock = clock
        #: key id -> session id -> (last use, requests in flight)
        self.sessions: dict[str, dict[str, list[float]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != "/mcp":
            await self.app(scope, receive, send)
            return
        key = str(scope.get("state", {}).get("key_id", ""))
        given = _session_of(scope["headers"])
        mine = self.sessions.setdefault(key, {})
        self._forget_expired(mine)
        if given is None and scope["method"] == "POST" and len(mine) >= self.max_per_key:
            await self._end_longest_idle(scope, mine)
        entry = mine.get(given) if given else None
        if entry is not None:
            entry[0] = self.clock()
            entry[1] += 1
        status = 0
        opened: str | None = None

        async def watched(message: Message) -> None:
            nonlocal status, opened
            if message["type"] == "http.response.start":
                status = message["status"]
                if given is None:
                    opened = _session_of(message.get("headers", []))
                    if opened is not None and status < 400:
                        mine[opened] = [self.clock(), 1.0]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            current = mine.get(opened or given or "")
            if current is not None:
                current[0] = self.clock()
                current[1] -= 1
            ended = (scope["method"] == "DELETE" and status < 400) or status == 404
            if given and ended:
                mine.pop(given, None)
            if not mine:
                self.sessions.pop(key, None)

    def _forget_expired(self, mine: dict[str, list[float]]) -> None:
        """Sessions the SDK ended for being idle (no request in flight for that long)."""
        if self.idle_timeout is None:
            return
        now = self.clock()
        for sid, (used, busy) in list(mine.items()):
            if not busy and now - used > self.idle_timeout:
                del mine[sid]

    async def _end_longest_idle(self, scope: Scope, mine: dict[str, list[float]]) -> None:
        """End the key's session unused the longest (one with a request in flight, too,
        if every one has: the new session is what the key asked for last)."""
        idle = [sid for sid, (_, busy) in mine.items() if not busy] or list(mine)
        victim = min(idle, key=lambda sid: mine[sid][0])
        del mine[victim]
        headers = [(k, v) for k, v in scope["headers"] if k not in (_SESSION, b"content-length")]
        delete: Scope = {
            **scope,
            "method": "DELETE",
            "headers": [*headers, (_SESSION, victim.encode())],
        }

        async def nothing() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(message: Message) -> None:
            return None

        await self.app(delete, nothing, discard)
