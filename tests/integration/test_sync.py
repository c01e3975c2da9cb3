"""The blocking facade works in plain code and inside a running event loop."""

from __future__ import annotations

import asyncio

import pytest

from kernel_sandbox.sync import Sandbox

pytestmark = pytest.mark.integration


def test_blocking_sandbox_end_to_end(docker_engine) -> None:  # type: ignore[no-untyped-def]
    with Sandbox.create(image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"}) as sb:
        sb.run_python("x = 20")
        assert sb.run_python("x * 2 + 2").text == "42"
        assert sb.run_shell("echo hi").stdout == "hi\n"
        sb.files.write("a.txt", "data")
        assert sb.files.read_text("a.txt") == "data"
    assert sb.closed


async def test_blocking_sandbox_inside_a_running_loop(docker_engine) -> None:  # type: ignore[no-untyped-def]
    # Jupyter users call the blocking API from a cell, i.e. inside a running loop.
    assert asyncio.get_running_loop() is not None
    sb = Sandbox.create(image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"})
    try:
        assert sb.run_python("print('ok')").stdout == "ok\n"
    finally:
        sb.close()
