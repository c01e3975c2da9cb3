"""A pytest plugin that runs the OpenAI Agents SDK's own sandbox tests on our client.

Loaded into a pytest run of the SDK's ``tests/`` (from its source distribution, the
version installed here) with ``PYTEST_PLUGINS=kernel_sandbox_agents_suite`` (this folder
on the path): before their modules are imported, ``UnixLocalSandboxClient`` — the client
the SDK's provider-neutral runner and session tests are written against — becomes
:class:`SuiteClient`, a
:class:`~kernel_sandbox.integrations.openai_agents.KernelSandboxClient` that takes the
same constructor arguments, so every session those tests create is a real
kernel_sandbox sandbox.  Nothing in the tests is changed.

Each test's outcome and how many sandboxes it made on our client go to the JSON file
named by ``KERNEL_SANDBOX_SUITE_REPORT``: a test that made none did not exercise our
client (an SDK unit test on its own fakes or on the local session class itself).

This module imports nothing from our ``tests`` package: in that run ``tests`` is the
SDK's.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from agents.sandbox import sandboxes as _sandboxes
from agents.sandbox.sandboxes import unix_local as _unix_local

from kernel_sandbox.integrations.openai_agents import (
    KernelSandboxClient,
    KernelSandboxClientOptions,
)
from kernel_sandbox.snapshots import LocalSnapshotStore

#: Our test suite's label (the sandboxes go with the other tests' leftovers) and the
#: suite run's (``KERNEL_SANDBOX_SUITE_LABEL``), by which its caller proves all are gone.
LABELS = {
    "kernel-sandbox.test": "1",
    "kernel-sandbox.test-suites": os.environ.get("KERNEL_SANDBOX_SUITE_LABEL", ""),
}
_scratch = Path(tempfile.mkdtemp(prefix="kernel-sandbox-agents-suite-"))
_made = 0
_results: dict[str, dict[str, Any]] = {}


class SuiteClient(KernelSandboxClient):
    """``UnixLocalSandboxClient``'s constructor, our client behind it; the SDK's
    ``UnixLocalSandboxClientOptions`` stand for our default options."""

    def __init__(
        self,
        *,
        instrumentation: Any = None,
        dependencies: Any = None,
        inherit_host_environment: bool = True,  # a sandbox never gets the host's environment
        host_environment_allowlist: Any = None,
    ) -> None:
        super().__init__(
            record_dir=_scratch / "notebooks",
            snapshot_store=LocalSnapshotStore(_scratch / "snapshots"),
            instrumentation=instrumentation,
            dependencies=dependencies,
        )

    async def create(
        self, *, snapshot: Any = None, manifest: Any = None, options: Any = None
    ) -> Any:
        global _made
        _made += 1
        if not isinstance(options, KernelSandboxClientOptions):
            options = KernelSandboxClientOptions(config={"labels": LABELS})
        return await super().create(snapshot=snapshot, manifest=manifest, options=options)

    async def resume(self, state: Any) -> Any:
        global _made
        _made += 1
        return await super().resume(state)


def pytest_configure(config: pytest.Config) -> None:
    _unix_local.UnixLocalSandboxClient = SuiteClient  # type: ignore[misc]
    _sandboxes.UnixLocalSandboxClient = SuiteClient  # type: ignore[misc]


def pytest_runtest_setup(item: pytest.Item) -> None:
    global _made
    _made = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "sandboxes": 0})
    entry["sandboxes"] = _made
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["reason"] = str(report.longrepr)[-1500:]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["reason"] = str(report.longrepr)[-300:]


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("KERNEL_SANDBOX_SUITE_REPORT")
    if path:
        Path(path).write_text(json.dumps(_results, indent=1))
