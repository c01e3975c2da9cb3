"""The E2B file helper (``kernel_sandbox.server.e2b.filesystem.helper``) on the real
sandbox code (LocalKernelHost): what a helper that is not ours costs the host.

The helper is run isolated (``-I``) in the sandbox's working directory, so a module there
never stands in for one it imports.  Its interpreter is the sandbox's own (an image's
``python3``; here the sandbox's PATH, see ``StandInPython``): that one can stall the
helper, or answer anything.  Its answer is bounded all the same.
"""

from __future__ import annotations

import asyncio
import posixpath
import re

import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError

from kernel_sandbox import limits
from kernel_sandbox.server.e2b import filesystem
from kernel_sandbox.server.e2b.filesystem import helper

from .conftest import NewSandbox, StandInPython

MiB = 1024 * 1024


async def test_a_module_in_the_working_directory_does_not_answer_for_the_helper(
    new_sandbox: NewSandbox,
) -> None:
    sb = await new_sandbox()
    here = sb.resolve_path(".")
    forged = 'import sys\nsys.stdout.write(\'{"name": "forged"}\\n\')\nsys.exit(0)\n'
    await sb.files.write("json.py", forged)
    # the helper's own code answers (its protected-path checks included), not the sandbox's
    assert [e["name"] for e in await helper(sb, "stat", here, 1)] == [posixpath.basename(here)]


async def test_a_helper_the_sandbox_stalls_holds_the_host_only_to_its_deadline(
    new_sandbox: NewSandbox, stand_in_python: StandInPython, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 s for the product's 60: a cap raised past 15 minutes outlasts the guard below
    deadline = limits.E2B_FILE_OP_DEADLINE / 30
    monkeypatch.setattr(filesystem, "E2B_FILE_OP_DEADLINE", deadline)
    sb = await new_sandbox(env_vars=stand_in_python.env)
    here = sb.resolve_path(".")
    assert [e["name"] for e in await helper(sb, "stat", here, 1)] == [posixpath.basename(here)]
    stand_in_python.set("import time\ntime.sleep(3600)\n")
    with pytest.raises(ConnectError, match=re.escape(f"within {deadline:g}s")) as caught:
        # the guard only turns a hang into a failure: the deadline ends the call first
        await asyncio.wait_for(helper(sb, "stat", here, 1), 30)
    assert caught.value.code == Code.DEADLINE_EXCEEDED  # the SDK: TimeoutException
    stand_in_python.clear()  # the host is free: the next call answers
    assert [e["name"] for e in await helper(sb, "stat", here, 1)] == [posixpath.basename(here)]


async def test_an_entry_past_its_bytes_is_resource_exhausted_and_the_largest_real_one_fits(
    new_sandbox: NewSandbox, stand_in_python: StandInPython
) -> None:
    sb = await new_sandbox(env_vars=stand_in_python.env)
    # the largest entry a real helper prints: a path near PATH_MAX, of 255-byte names
    deep = "/".join(f"{i:03d}" + "d" * 252 for i in range(14))
    await sb.files.mkdir(deep)
    (entry,) = await helper(sb, "stat", sb.resolve_path(deep), 1)
    assert entry["path"] == sb.resolve_path(deep) and len(entry["path"]) > 3600
    # a helper that is not ours answers 8 MiB for one entry: kept within the cap, refused
    flood = (
        "import sys\nsys.stdout.write('{\"name\": \"' + 'x' * (8 << 20) + '\"}\\n')\nsys.exit(0)\n"
    )
    stand_in_python.set(flood)
    with pytest.raises(ConnectError, match="too large") as caught:
        await helper(sb, "stat", sb.resolve_path("."), 1)
    assert caught.value.code == Code.RESOURCE_EXHAUSTED
