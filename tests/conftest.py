"""Shared test settings: the integration tier needs a real engine and must not skip in CI."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

IN_CI = bool(os.environ.get("CI"))
TEST_LABEL = {"kernel-sandbox.test": "1"}
#: A virtualenv of ms-enclave's own client (made once, reused across runs and tiers).
ENCLAVE_VENV = Path(os.environ.get("KS_ENCLAVE_VENV", "/tmp/ks-venvs/enclave-0.0.8"))
#: A virtualenv of E2B's own SDKs and what their test suites need (made once, reused).
E2B_VENV = Path(os.environ.get("KS_E2B_VENV", "/tmp/ks-venvs/e2b-2.63"))
#: What that virtualenv holds: E2B's SDK and code interpreter, and their suites' runners.
E2B_PACKAGES = (
    "e2b==2.63.*",
    "e2b-code-interpreter==2.11.*",
    "pytest>=8",
    "pytest-asyncio>=1.0",
    "pytest-timeout>=2.2",
    "python-dotenv>=1.0",
)


def require(condition: bool, reason: str) -> None:
    """Skip locally, fail in CI: the integration tier must run there."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: integration tests must run, not skip)", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def host_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if missing) across processes.

    pytest-xdist's workers, the gVisor pass beside the first one and other runs on the
    same host each take it, so what it guards happens one at a time on the machine.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


#: Locks of the tests that must not overlap another process's (see ``host_lock``).
LOCKS = Path(tempfile.gettempdir()) / "kernel-sandbox-test-locks"


def pytest_report_header() -> str:
    """Which engine runtime the sandboxes of this run use (the runsc pass says so)."""
    runtime = os.environ.get("KERNEL_SANDBOX_RUNTIME") or "the engine's default"
    return f"sandbox runtime: {runtime} (KERNEL_SANDBOX_RUNTIME)"


@pytest.fixture(scope="session")
def enclave_python() -> Path:
    """The interpreter of a virtualenv with ``ms-enclave[docker]==0.0.8`` (made once).

    ms-enclave's own ``HttpSandboxManager`` drives our server from there, unmodified and
    with its own dependencies (the Docker and the Kubernetes tiers both use it).
    """
    with host_lock(ENCLAVE_VENV.with_name(f"{ENCLAVE_VENV.name}.lock")):  # workers start at once
        return _made_enclave_python()


def _made_enclave_python() -> Path:
    python = ENCLAVE_VENV / "bin" / "python"
    check = [str(python), "-c", "from ms_enclave.sandbox.manager import HttpSandboxManager"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    made = subprocess.run([sys.executable, "-m", "venv", str(ENCLAVE_VENV)], capture_output=True)
    require(made.returncode == 0, f"cannot make a virtualenv: {made.stderr.decode()[-500:]}")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "ms-enclave[docker]==0.0.8"],
        capture_output=True,
        timeout=600,
    )
    require(pip.returncode == 0, f"cannot install ms-enclave: {pip.stderr.decode()[-800:]}")
    return python


@pytest.fixture(scope="session")
def e2b_python() -> Path:
    """The interpreter of a virtualenv with E2B's SDKs from PyPI (made once).

    ``e2b`` and ``e2b-code-interpreter`` drive our server from there, unmodified and
    with their own dependencies; they are never a dependency of the package.
    """
    with host_lock(E2B_VENV.with_name(f"{E2B_VENV.name}.lock")):  # workers start at once
        return _made_e2b_python()


def _made_e2b_python() -> Path:
    python = E2B_VENV / "bin" / "python"
    check = [str(python), "-c", "import e2b_code_interpreter, pytest_asyncio, dotenv"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    made = subprocess.run([sys.executable, "-m", "venv", str(E2B_VENV)], capture_output=True)
    require(made.returncode == 0, f"cannot make a virtualenv: {made.stderr.decode()[-500:]}")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *E2B_PACKAGES],
        capture_output=True,
        timeout=600,
    )
    require(pip.returncode == 0, f"cannot install E2B's SDKs: {pip.stderr.decode()[-800:]}")
    return python
