"""A server gives each key its own maximum network policy; sandboxes get at most that.

No traffic leaves the machine: key A may reach one made-up host, and the test only
checks that everything else is refused by its sandbox's proxy on the server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import nbformat
import pytest

from kernel_sandbox.client.remote import RemoteSandbox
from kernel_sandbox.server.auth import key_id
from tests.integration.serving import KEY_A, KEY_B, Server

pytestmark = pytest.mark.integration

FETCH = (
    "import urllib.request as u\ntry:\n    u.urlopen('https://outside.example.net/', timeout=20)\n"
    "except Exception as e:\n    print(e)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(
        f"t-egress-{os.getpid()}",
        tmp_path_factory.mktemp("nb"),
        ["--key-network", f"{KEY_A}=files.example.org"],
    ).start()
    yield srv
    srv.stop()


async def test_each_key_gets_at_most_its_own_policy(server: Server) -> None:
    async with await RemoteSandbox.create(
        server.url, api_key=KEY_A, network=["files.example.org", "other.example.net"]
    ) as a:
        assert a.config.network == ["files.example.org"]  # the rest was beyond key A's maximum
        refused = await a.run_python(FETCH)
        assert "403 refused by the sandbox's network policy" in refused.stdout, refused.text
        sandbox_id = a.id
    notebook = server.record_dir / key_id(KEY_A) / f"{sandbox_id}.ipynb"
    cells = nbformat.read(notebook, as_version=4).cells
    assert any("network policy" in c.source and "outside.example.net" in c.source for c in cells)

    async with await RemoteSandbox.create(server.url, api_key=KEY_B, network="packages") as b:
        assert b.config.network == "none"  # key B has the server's maximum: no network
        offline = await b.run_python(FETCH)
        assert "403" not in offline.stdout and offline.stdout.strip(), offline.text
