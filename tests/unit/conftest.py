"""The unit tier runs the real sandbox code on LocalKernelHost (a local ipykernel).

``new_sandbox(**settings)`` starts one (about a second) and closes it after the test;
``idle_sandbox`` is a real AsyncSandbox whose kernel is never started, for tests that
must show nothing reaches the kernel (argument errors, schemas).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.testing import LocalKernelHost

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
