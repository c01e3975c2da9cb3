"""``kernel-sandbox serve``: sandboxes as a service.

* :mod:`.enclave` — ms-enclave's REST API (its ``HttpSandboxManager`` works unmodified)
* :mod:`.native` — everything ``AsyncSandbox`` does under ``/v1``, outputs streamed (SSE)
* :mod:`.auth`, :mod:`.limits`, :mod:`.tenancy`, :mod:`.policy` — keys, caps, owners
* :mod:`.restart` — what a killed predecessor left

Its clients, ``RemoteSandbox`` (the local API) and ``HttpSandboxManager`` (ms-enclave's
manager API), live in :mod:`kernel_sandbox.client`.

The server is thin: it translates HTTP and MCP into the same sandbox API and adds only
auth, tenancy, limits and streaming.
"""

from .._extras import require_extra

with require_extra("server", "kernel_sandbox.server (kernel-sandbox serve)"):
    from .settings import ServerSettings

__all__ = ["ServerSettings"]
