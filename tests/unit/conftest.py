"""The unit tier runs the real sandbox code on LocalKernelHost (a local ipykernel).

``new_sandbox(**settings)`` starts one (about a second) and closes it after the test;
``idle_sandbox`` is a real AsyncSandbox whose kernel is never started, for tests that
must show nothing reaches the kernel (argument errors, schemas).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.testing import LocalKernelHost
from tests.conftest import require

NewSandbox = Callable[..., Awaitable[AsyncSandbox]]


@pytest.fixture
async def new_sandbox() -> AsyncIterator[NewSandbox]:
    made: list[AsyncSandbox] = []

    async def make(**settings: Any) -> AsyncSandbox:
        # a loaded machine (CI, 2 cores shared) may take long to start a kernel
        settings.setdefault("startup_timeout", 120)
        sandbox = await AsyncSandbox.create(host="local", **settings)
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        await sandbox.close()


@pytest.fixture
async def idle_sandbox() -> AsyncIterator[AsyncSandbox]:
    config = SandboxConfig(
        host="local", volumes={"/host/out": {"bind": "/sandbox/data", "mode": "ro"}}, timeout=20
    )
    sandbox = AsyncSandbox(config, LocalKernelHost("unit", config), "unit")
    yield sandbox
    await sandbox.close()


@pytest.fixture
def bash_kernelspec(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bash_kernel's kernelspec in a private Jupyter path (nothing installed globally):
    a real non-IPython kernel for LocalKernelHost's contexts."""
    require(importlib.util.find_spec("bash_kernel") is not None, "bash_kernel is not installed")
    prefix = tmp_path_factory.getbasetemp() / "bash-kernelspec"
    if not (prefix / "share/jupyter/kernels/bash/kernel.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "bash_kernel.install", "--prefix", str(prefix)],
            check=True,
            capture_output=True,
        )
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share/jupyter"))
