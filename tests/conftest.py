"""Shared test settings: the integration tier needs a real engine and must not skip in CI."""

from __future__ import annotations

import os

import pytest

IN_CI = bool(os.environ.get("CI"))
TEST_LABEL = {"kernel-sandbox.test": "1"}


def require(condition: bool, reason: str) -> None:
    """Skip locally, fail in CI: the integration tier must run there."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: integration tests must run, not skip)", pytrace=False)
    pytest.skip(reason)


def pytest_report_header() -> str:
    """Which engine runtime the sandboxes of this run use (the runsc pass says so)."""
    runtime = os.environ.get("KERNEL_SANDBOX_RUNTIME") or "the engine's default"
    return f"sandbox runtime: {runtime} (KERNEL_SANDBOX_RUNTIME)"
