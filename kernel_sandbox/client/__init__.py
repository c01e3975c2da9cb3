"""Clients of a ``kernel-sandbox serve`` server: the remote twins of the local classes.

:class:`RemoteSandbox` offers :class:`~kernel_sandbox.AsyncSandbox`'s calls over HTTP;
:class:`HttpSandboxManager` offers :class:`~kernel_sandbox.SandboxManager`'s.
"""

from .._extras import require_extra

with require_extra("client", "kernel_sandbox.client (RemoteSandbox, HttpSandboxManager)"):
    from .manager import HttpSandboxManager
    from .remote import RemoteFiles, RemoteSandbox

__all__ = ["HttpSandboxManager", "RemoteFiles", "RemoteSandbox"]
