"""The unit tier runs the real sandbox code on LocalKernelHost (a local ipykernel).

``new_sandbox(**settings)`` starts one (about a second) and closes it after the test;
``idle_sandbox`` is a real AsyncSandbox whose kernel is never started, for tests that
must show nothing reaches the kernel (argument errors, schemas).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox.config import KERNEL_PYTHON, SandboxConfig
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


class StandInPython:
    """A ``python3`` of the sandbox's that is not the real one: the untrusted interpreter
    the host's helpers run (an image's own ``python3``; here, the sandbox's PATH).

    ``env`` is the sandbox's ``env_vars`` that put its directory first on PATH; until
    :meth:`set` it holds nothing, so the real ``python3`` answers.  Whatever its flags
    (``-I`` included), the stand-in runs ``source`` with the real interpreter."""

    def __init__(self, where: Path) -> None:
        # the helpers take the kernel's venv first: there, the stand-in would never run
        require(not os.path.exists(KERNEL_PYTHON), f"{KERNEL_PYTHON} exists on this host")
        self.bin = where / "stand-in-bin"
        self.bin.mkdir()
        self.env = {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}

    def set(self, source: str) -> None:
        path = self.bin / "python3"
        path.write_text(f"#!{sys.executable}\n{source}")
        path.chmod(0o755)

    def clear(self) -> None:
        (self.bin / "python3").unlink()


@pytest.fixture
def stand_in_python(tmp_path: Path) -> StandInPython:
    return StandInPython(tmp_path)


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
