"""A process that used sandboxes can fork() and use sandboxes in the child.

nbclient runs notebooks in parallel with multiprocessing's fork start method; before,
a child of a process that had run a sandbox waited for ever (the inherited worker
threads, portal loop and ZMQ context were the parent's).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys

import pytest

from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.sync import Sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork() start method")


def _in_child(code: str) -> list[str]:
    with Sandbox.create(host="local", startup_timeout=120) as sb:
        blocking = sb.run_python(code).text
        sb.files.write("f.txt", "written in the child")
        shell = sb.run_shell("cat f.txt").stdout

    async def main() -> str:
        async with await AsyncSandbox.create(host="local", startup_timeout=120) as sb:
            return (await sb.run_python(code)).text

    return [blocking, shell, asyncio.run(main())]


def test_sandboxes_work_in_a_forked_child() -> None:
    with Sandbox.create(host="local", startup_timeout=120) as sb:
        assert sb.run_python("6 * 7").text == "42"  # the parent used one: portal, threads
        sb.files.write("f.txt", "x")
        fork = multiprocessing.get_context("fork")
        with fork.Pool(2) as pool:
            results = pool.map_async(_in_child, ["6 * 7", "'child'"]).get(timeout=240)
        assert results == [
            ["42", "written in the child", "42"],
            ["'child'", "written in the child", "'child'"],
        ]
        assert sb.run_python("1 + 1").text == "2"  # and the parent's still works
