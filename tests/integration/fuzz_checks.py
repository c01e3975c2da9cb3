"""schemathesis hooks for ``test_server_fuzz``: its one check (``SCHEMATHESIS_HOOKS``).

``not_a_server_error_but_e2bs_gone_sandbox``: every 5xx is a failure, as in
schemathesis' own ``not_a_server_error``, except the one E2B's protocol prescribes.  A
call into ``/e2b/sandbox/...`` for a sandbox that is gone or paused answers 502 (E2B's
proxy does; its SDKs read it as a sandbox that timed out), and the fuzzer ends its
sandbox itself now and then: it reuses the ids earlier responses gave, so it sets that
sandbox's timeout to 0, pauses it, deletes it.  Such a 502 passes only when the control
API, asked at once, agrees that the sandbox is not running.
"""

from __future__ import annotations

import os
from typing import Any

import httpx2
import schemathesis
from schemathesis.checks import not_a_server_error

#: Set by the test: the server's address, the key the run uses and the E2B sandbox its
#: ``-H E2b-Sandbox-Id`` routes every call into ``/e2b/sandbox`` to.
URL, KEY = os.environ.get("KS_FUZZ_URL", ""), os.environ.get("KS_FUZZ_KEY", "")
SANDBOX = os.environ.get("KS_FUZZ_SANDBOX", "")


def _gone(sandbox_id: str) -> bool:
    answer = httpx2.get(f"{URL}/e2b/sandboxes/{sandbox_id}", headers={"X-API-Key": KEY}, timeout=30)
    return answer.status_code == 404 or (
        answer.status_code == 200 and answer.json().get("state") != "running"
    )


@schemathesis.check
def not_a_server_error_but_e2bs_gone_sandbox(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 5xx fails the run, unless it is E2B's 502 for a sandbox that is not running."""
    if response.status_code == 502 and case.operation.path.startswith("/e2b/sandbox/"):
        said = response.json() if response.text.startswith("{") else {}
        if said.get("code") == 502 and SANDBOX and _gone(SANDBOX):
            return None
    return not_a_server_error(ctx, response, case)
