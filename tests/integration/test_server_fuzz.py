"""Property-based fuzzing of the served OpenAPI document: no 5xx, no hang.

schemathesis generates requests for every operation from the document (bodies, query
and path parameters, types it does not expect) and checks each response; a request
that takes longer than its timeout fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.serving import KEY_A, Server

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(
        f"t-fuzz-{os.getpid()}",
        tmp_path,
        ["--allow-image", "kernel-sandbox:python", "--max-sandboxes-per-key", "2"],
    ).start()
    yield srv
    srv.stop()


def test_fuzzing_the_openapi_document_finds_no_server_error_and_no_hang(server: Server) -> None:
    binary = shutil.which("schemathesis") or shutil.which("st")
    require(binary is not None, "schemathesis is not installed (pip install schemathesis)")
    done = subprocess.run(
        [
            str(binary),
            "run",
            f"{server.url}/openapi.json",
            "-H",
            f"X-API-Key: {KEY_A}",
            "--checks",
            "not_a_server_error",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            os.environ.get("KS_FUZZ_EXAMPLES", "15"),
            "--request-timeout",
            "120",
            "--workers",
            "1",
            "--generation-deterministic",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=server.record_dir,  # schemathesis keeps a cache where it runs
    )
    report = done.stdout[-6000:] + done.stderr[-2000:]
    print(report, file=sys.stderr)
    assert done.returncode == 0, report
    assert "27/27" in done.stdout or "Tested: " in done.stdout
