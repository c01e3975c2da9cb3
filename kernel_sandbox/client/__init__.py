"""Clients of a ``kernel-sandbox serve`` server: the remote twins of the local classes.

:class:`RemoteSandbox` offers :class:`~kernel_sandbox.AsyncSandbox`'s calls over HTTP
and :class:`HttpSandboxManager` :class:`~kernel_sandbox.SandboxManager`'s (both satisfy
the seams of :mod:`kernel_sandbox.protocols`); :func:`aconnect` and :func:`connect`
are the way in.
"""

from __future__ import annotations

from .._extras import require_extra
from ..sync import Sandbox, run_sync

with require_extra("client", "kernel_sandbox.client (RemoteSandbox, HttpSandboxManager)"):
    from .manager import HttpSandboxManager
    from .remote import RemoteFiles, RemoteSandbox

__all__ = ["HttpSandboxManager", "RemoteFiles", "RemoteSandbox", "aconnect", "connect"]


async def aconnect(
    url: str,
    sandbox_id: str | None = None,
    *,
    api_key: str | None = None,
    timeout: float = 600.0,
) -> RemoteSandbox:
    """A sandbox of a ``kernel-sandbox serve`` server, with ``AsyncSandbox``'s calls.

    With ``sandbox_id``, the caller's existing sandbox there; without, a new one with
    the server's defaults (``RemoteSandbox.create`` takes settings).  The server's key
    decides which sandboxes the caller may see; ``timeout`` bounds each HTTP call.
    """
    return await RemoteSandbox.connect(url, sandbox_id, api_key=api_key, timeout=timeout)


def connect(
    url: str,
    sandbox_id: str | None = None,
    *,
    api_key: str | None = None,
    timeout: float = 600.0,
) -> Sandbox:
    """Blocking :func:`aconnect`: a :class:`~kernel_sandbox.Sandbox` whose calls go to the
    server; what only a local sandbox has (``host``, ``labels``, ``connection_info``,
    contexts) raises ``ConfigError``."""
    return Sandbox(run_sync(aconnect(url, sandbox_id, api_key=api_key, timeout=timeout)))
