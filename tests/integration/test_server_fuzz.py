"""Property-based fuzzing of the served OpenAPI document: no 5xx, no hang.

schemathesis generates requests for every operation from the document (bodies, query
and path parameters, types it does not expect) and checks each response; a request
that takes longer than its timeout fails the run.

The E2B routes inside a sandbox (``/e2b/sandbox/...``) find theirs by E2B's routing
headers, which the document does not describe (no header names one: E2B's proxy answers
502, "sandbox not found", which its SDK reads as a timed-out sandbox).  Every request
carries a real E2B sandbox's headers, so those routes' handlers are fuzzed too.  The
fuzzer reuses ids from earlier answers, so it may pause or end that sandbox itself:
the check (:mod:`tests.integration.fuzz_checks`) lets E2B's 502 pass only while the
control API agrees the sandbox is not running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
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
        log=tmp_path.with_name(f"{tmp_path.name}-server.log"),  # for a failure's report
    ).start()
    yield srv
    srv.stop()


def e2b_sandbox(server: Server) -> tuple[str, list[str]]:
    """A new E2B sandbox's id and schemathesis' ``-H`` arguments that route
    ``/e2b/sandbox`` to it."""
    created = httpx2.post(
        f"{server.url}/e2b/sandboxes",
        json={"templateID": "base", "timeout": 1800},  # E2B's default: 15 s
        headers={"X-API-Key": KEY_A},
        timeout=120,
    )
    assert created.status_code == 201, created.text
    body = created.json()
    return body["sandboxID"], [
        "-H",
        f"E2b-Sandbox-Id: {body['sandboxID']}",
        "-H",
        f"X-Access-Token: {body['envdAccessToken']}",
    ]


def test_fuzzing_the_openapi_document_finds_no_server_error_and_no_hang(server: Server) -> None:
    binary = shutil.which("schemathesis") or shutil.which("st")
    require(binary is not None, "schemathesis is not installed (pip install schemathesis)")
    sandbox_id, e2b_headers = e2b_sandbox(server)
    hooks = {
        "SCHEMATHESIS_HOOKS": str(Path(__file__).with_name("fuzz_checks.py")),
        "KS_FUZZ_URL": server.url,
        "KS_FUZZ_KEY": KEY_A,
        "KS_FUZZ_SANDBOX": sandbox_id,
    }
    done = subprocess.run(
        [
            str(binary),
            "run",
            f"{server.url}/openapi.json",
            "-H",
            f"X-API-Key: {KEY_A}",
            *e2b_headers,
            "--checks",
            "not_a_server_error_but_e2bs_gone_sandbox",
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
        env={**os.environ, **hooks},
    )
    said = server.log.read_text(errors="replace")[-4000:] if server.log else ""
    report = done.stdout[-6000:] + done.stderr[-2000:] + "\n--- the server's log:\n" + said
    print(report, file=sys.stderr)
    assert done.returncode == 0, report
    assert "27/27" in done.stdout or "Tested: " in done.stdout
