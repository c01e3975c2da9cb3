"""MCP over stdio with bounded lines: one JSON-RPC message may not cost the host more
than its cap, whatever the client writes.

The SDK's stdio transport reads a whole line, however long, then parses it: a 64 MiB
line cost 320 MB.  :class:`BoundedLines` stands in for its stdin: it reads at most
``MAX_MCP_LINE_BYTES`` of a line, skips the rest of a longer one without holding it,
refuses a line whose JSON would cost too much to parse (the HTTP server's shape rule,
:func:`~kernel_sandbox.limits.json_shape_error`), and answers either with a JSON-RPC
error for the request's id, so the client hears why instead of waiting.  Everything
else (the SDK's stdout handling, its session) stays the SDK's.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import IO, Any, cast

import anyio
import anyio.to_thread
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError

from ..limits import MAX_MCP_LINE_BYTES, MCP_REFUSED_HEAD_BYTES, json_shape_error

__all__ = ["BoundedLines", "run_stdio"]

_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")')


def _request_id(head: bytes) -> int | str | None:
    match = _ID.search(head[:MCP_REFUSED_HEAD_BYTES])
    if match is None:
        return None
    raw = match[1].decode("utf-8", "replace")
    return raw.strip('"') if raw.startswith('"') else int(raw)


#: A blocking read of stdin in a worker thread, left behind if the reader is cancelled.
_in_thread = functools.partial(anyio.to_thread.run_sync, abandon_on_cancel=True)


class BoundedLines:
    """Lines of a binary stream, each at most ``limit`` bytes, for ``stdio_server``."""

    def __init__(self, raw: IO[bytes], limit: int = MAX_MCP_LINE_BYTES) -> None:
        self.raw = raw
        self.limit = limit
        self.reply: Any = None  # the SDK's write stream, once it exists
        self._ready = anyio.Event()
        #: Lines refused so far (too long, or too costly to parse).
        self.refused = 0

    def connect(self, write_stream: Any) -> None:
        """Where refusals are answered: the stream the server writes its messages to."""
        self.reply = write_stream
        self._ready.set()

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line, problem = await _in_thread(self._read)
            if problem is None:
                if not line:
                    raise StopAsyncIteration
                return line.decode("utf-8", "replace")
            self.refused += 1
            print(f"kernel-sandbox mcp: refused a message: {problem}", file=sys.stderr)
            await self._ready.wait()
            error = ErrorData(code=INVALID_REQUEST, message=problem)
            refusal = JSONRPCError(jsonrpc="2.0", id=_request_id(line), error=error)
            await self.reply.send(SessionMessage(refusal))

    def _read(self) -> tuple[bytes, str | None]:
        """The next line, or its head and why it is refused (runs in a thread)."""
        line = self.raw.readline(self.limit + 1)
        if len(line) > self.limit and not line.endswith(b"\n"):
            head, skipped = line[:MCP_REFUSED_HEAD_BYTES], len(line)
            del line
            while chunk := self.raw.readline(1024 * 1024):
                skipped += len(chunk)
                if chunk.endswith(b"\n"):
                    break
            return head, (
                f"a message of {skipped:,} bytes is longer than the {self.limit:,} one line "
                "may hold (MAX_MCP_LINE_BYTES); write large files in parts"
            )
        problem = json_shape_error(line)
        return (line[:MCP_REFUSED_HEAD_BYTES], problem) if problem is not None else (line, None)


async def run_stdio(server: Any, lines: BoundedLines | None = None) -> None:
    """Serve ``server`` (an ``MCPServer``) over this process's stdin and stdout."""
    lines = lines or BoundedLines(sys.stdin.buffer)
    stdin = cast("anyio.AsyncFile[str]", lines)  # all the SDK asks of it: async lines
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        lines.connect(write_stream)
        lowlevel = server._lowlevel_server  # as MCPServer.run_stdio_async runs it
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
