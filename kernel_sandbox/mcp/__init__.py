"""The MCP server: run Python (state kept), run shell, file operations, for any MCP client.

``kernel-sandbox mcp`` serves one sandbox over stdio; ``kernel-sandbox serve`` mounts
the same tools at ``/mcp`` (streamable HTTP): sandboxes named by id, per MCP session,
or per API key for session-less calls.
"""

from .._extras import require_extra

with require_extra("server", "kernel_sandbox.mcp"):
    from .server import build_mcp_server
    from .sessions import SessionSandboxes, StdioSandbox

__all__ = ["SessionSandboxes", "StdioSandbox", "build_mcp_server"]
