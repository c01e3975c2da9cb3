"""The remote client reads a server's event stream one bounded line at a time: an event
past MAX_EVENT_BYTES is an error, never a result (httpx's mock transport is the server)."""

from __future__ import annotations

import httpx2
import pytest

from kernel_sandbox.client.remote import RemoteSandbox
from kernel_sandbox.errors import SandboxError
from kernel_sandbox.limits import MAX_EVENT_BYTES


async def test_an_event_over_the_cap_is_an_error() -> None:
    huge = b"event: output\ndata: " + b"x" * (MAX_EVENT_BYTES + 1) + b"\n\n"

    def serve(request: httpx2.Request) -> httpx2.Response:
        assert request.url.params["stream"] == "true"
        return httpx2.Response(200, content=huge, headers={"content-type": "text/event-stream"})

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(serve), base_url="http://server")
    view = {"id": "sb-1", "image": "kernel-sandbox:python", "config": {}}
    sandbox = RemoteSandbox("http://server", None, view, client)
    with pytest.raises(SandboxError, match="an event from the server is too large"):
        await sandbox.run_python("print('x' * 10**8)", on_output=lambda output: None)
    await client.aclose()
