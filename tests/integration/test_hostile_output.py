"""Hostile amounts of output: a gigabyte of stdout, tight print loops, huge shell output,
huge files.  The cell or command runs to its end (or its timeout), the result says
what was dropped and keeps the head and the tail, the sandbox works afterwards, and the
*host* process' memory stays bounded (a resource bound, measured as peak RSS growth).
The gigabyte of prints and the tight print loop run in python, R and JavaScript
(tests/integration/hostile_code.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import nbformat
import pytest

from kernel_sandbox.errors import FileOperationError
from kernel_sandbox.limits import DEFAULT_MAX_OUTPUT_BYTES
from kernel_sandbox.notebook.cells import python_cell, shell_cell
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet
from tests.integration.conftest import PYTHON_IMAGE
from tests.integration.hostile_code import (
    HOSTILE_LANGUAGES,
    PYTHON,
    Hostile,
    require_image,
    sandbox_options,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

GB = 1024**3
MB = 1024**2
#: Peak host memory a capped call may add: the cap (10 MiB) plus messages in flight.
HOST_BOUND = 200 * MB


class PeakRss:
    """The growth of this process' peak RSS while the block runs (Linux)."""

    growth = 0

    @staticmethod
    def _kb(field: str) -> int:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith(field))
        return int(line.split()[1]) * 1024

    @contextmanager
    def measure(self) -> Iterator[PeakRss]:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # reset VmHWM to the current RSS
        before = self._kb("VmRSS:")
        yield self
        self.growth = self._kb("VmHWM:") - before


@pytest.fixture
async def py_sandbox(make_sandbox) -> AsyncSandbox:  # type: ignore[no-untyped-def]
    """A sandbox on the small python image, with the default memory limit (1g).

    A gigabyte printed faster than the host reads used to get the kernel killed as out
    of memory: ZMQ's send queue (1000 messages of ~1 MiB) and IPython 9's record of
    every output of the session (``history_manager.outputs``) each held it inside the
    sandbox.  ``programs/launcher.py`` bounds the first (16 messages; iopub waits for
    the host) and keeps nothing in the second; the flood peaks at ~60 MiB in the kernel.
    """
    return await make_sandbox(image=PYTHON_IMAGE)  # type: ignore[no-any-return]


def kept_text(text: str) -> str:
    """``text`` without the marker line the cap put in (and the newline it may start with)."""
    return re.sub(r"\n?\[\.\.\. output capped: [^\n]*\]\n", "", text)


@pytest.mark.parametrize("lang", HOSTILE_LANGUAGES)
async def test_a_gigabyte_of_stdout_in_1_mb_prints(make_sandbox, lang: Hostile) -> None:  # type: ignore[no-untyped-def]
    """A sandbox with the default memory limit (1g): see ``py_sandbox`` for python.  R's
    and Deno's kernels hold such a flood themselves (``Hostile.flood_capped``) and end
    out of memory: named, restarted, the host still bounded."""
    require_image(lang)
    sandbox: AsyncSandbox = await make_sandbox(**sandbox_options(lang))
    code = lang.print_flood
    with PeakRss().measure() as rss:
        ex = await sandbox.run_code(code, timeout=600)
    assert rss.growth < HOST_BOUND, f"host peak RSS grew {rss.growth / MB:.0f} MB"
    if not lang.flood_capped:
        assert ex.status == "kernel_died" and ex.state_lost, ex.message
        assert "out of memory" in ex.message and "restarted" in ex.message
        again = await sandbox.run_code(lang.answer)
        assert (again.status, again.stdout) == ("ok", "42\n"), again.text
        return
    assert ex.status == "ok", ex.message
    total = 1000 * 10**6 + len("THE END\n")
    assert ex.truncated_bytes == total - DEFAULT_MAX_OUTPUT_BYTES
    assert "output capped" in ex.stdout and f"{ex.truncated_bytes:,} bytes" in ex.stdout
    kept = kept_text(ex.stdout)
    assert len(kept.encode()) <= DEFAULT_MAX_OUTPUT_BYTES
    assert kept.startswith("chunk 0000 xxx") and kept.endswith("xxx\nTHE END\n")
    nbformat.validate(nbformat.v4.new_notebook(cells=[python_cell(code, ex)]))
    after = await sandbox.run_code("survivor")
    assert after.status == "ok" and "still here" in after.text, after.text


async def test_the_kernel_queues_little_for_a_host_that_does_not_read(
    py_sandbox: AsyncSandbox,
) -> None:
    """300 displays of 1 MiB from a thread after its cell, while the host reads nothing:
    the kernel's own memory grows by its bounded send queue, not by the flood (ZMQ's
    default queue, 1000 messages, held all 300 MiB)."""
    code = """
import resource, threading
from IPython.display import display
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = peak()
def flood():
    for i in range(300):
        display({'text/plain': 'd' * (1024**2)}, raw=True)
flooding = threading.Thread(target=flood)
flooding.start()
"""
    assert (await py_sandbox.run_python(code)).status == "ok"
    await asyncio.sleep(8)  # the host reads nothing meanwhile
    measure = "flooding.join(); print((peak() - before) // 2**20)"
    ex = await py_sandbox.run_python(measure, timeout=600)
    assert ex.status == "ok", ex.text
    growth = int(ex.stdout.strip().splitlines()[-1])
    print(f"\n[kernel] peak memory +{growth} MiB while 300 MiB went unread")
    assert growth < 100, f"the kernel's memory grew {growth} MiB"


async def test_one_write_of_300_mb(py_sandbox: AsyncSandbox) -> None:
    code = "import sys; sys.stdout.write('H' * 1000 + 'x' * (300 * 10**6) + 'T' * 1000)"
    with PeakRss().measure() as rss:
        ex = await py_sandbox.run_python(code, timeout=600)
    assert ex.status == "ok", ex.message
    assert rss.growth < HOST_BOUND, f"host peak RSS grew {rss.growth / MB:.0f} MB"
    assert ex.truncated_bytes == 300 * 10**6 + 2000 - DEFAULT_MAX_OUTPUT_BYTES
    kept = kept_text(ex.stdout)
    assert kept.startswith("H" * 1000 + "x") and kept.endswith("x" + "T" * 1000)
    assert (await py_sandbox.run_python("1 + 1")).text == "2"


@pytest.mark.parametrize("lang", HOSTILE_LANGUAGES)
async def test_a_tight_print_loop_is_interrupted_at_its_timeout(
    make_sandbox: Any, lang: Hostile
) -> None:
    require_image(lang)
    sandbox = await make_sandbox(**sandbox_options(lang), max_output_bytes=64 * 1024)
    await sandbox.run_code(lang.set_kept)
    with PeakRss().measure() as rss:
        ex = await sandbox.run_code(lang.tight_print_loop, timeout=5)
    assert rss.growth < HOST_BOUND
    kept = kept_text(ex.stdout)
    print(f"\n[hostile] {lang.language} print loop: {ex.status}, {len(kept)} characters kept")
    assert len(kept.encode()) <= 64 * 1024
    assert ex.status in lang.tight_loop_ends, ex.message
    if not lang.print_backlog_clears:
        # Deno goes on sending the lines it queued, stamped with whichever request runs
        # then: the next calls carry the loop's lines, their own results come late, until
        # the queue is sent or reaches memory_limit (an OOM kill).  A restart ends it.
        await sandbox.restart()
        again = await sandbox.run_code(lang.answer)
        assert (again.status, again.stdout) == ("ok", "42\n"), again.text
        return
    assert not ex.state_lost, ex.message
    after = await sandbox.run_code(lang.kept_plus_one)
    assert after.stdout == "42\n", after.text
    if lang is not PYTHON:
        return
    assert ex.error is not None and ex.error.ename == "KeyboardInterrupt"
    assert ex.truncated_bytes > 0 and "output capped" in ex.stdout
    assert kept.startswith("1\n2\n3\n")
    assert (await sandbox.run_python("i > 1000")).text == "True"
    # the tail is the latest output: the last number printed is the loop's last value
    last = int(kept.rstrip("\n").rsplit("\n", 1)[-1])
    assert (await sandbox.run_python("i")).text in (str(last), str(last + 1))


@pytest.mark.timeout(300)  # without a deadline check per message this cell runs for hours
async def test_a_cell_that_outpaces_a_slow_listener_is_still_interrupted(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    # A generous grace: on 2 busy cores the kernel may take seconds to drain its own
    # queue after the interrupt; what is tested is that the interrupt is sent at all.
    sandbox = await make_sandbox(image="kernel-sandbox:python", interrupt_grace=30)
    seen = 0

    async def slow_listener(output: dict[str, object]) -> None:
        nonlocal seen
        seen += 1
        await asyncio.sleep(0.005)  # slower than the kernel sends: iopub is never silent

    code = "from IPython.display import display\ni = 0\nwhile True:\n    i += 1\n    display(i)"
    ex = await sandbox.run_python(code, timeout=3, on_output=slow_listener)
    assert ex.status == "timeout" and not ex.state_lost, ex.message
    assert ex.error is not None and ex.error.ename == "KeyboardInterrupt"
    assert seen > 0
    assert (await sandbox.run_python("i > 0")).text == "True"


async def test_a_gigabyte_of_shell_output_on_both_streams(py_sandbox: AsyncSandbox) -> None:
    command = (
        "echo FIRST; head -c 1G /dev/zero | tr '\\0' x; echo; echo LAST; "
        "echo ERR-FIRST >&2; yes e | head -c 100M >&2; echo ERR-LAST >&2"
    )
    with PeakRss().measure() as rss:
        result = await py_sandbox.run_shell(command, timeout=600)
    assert result.exit_code == 0 and not result.timed_out, result.stderr[-500:]
    assert rss.growth < HOST_BOUND, f"host peak RSS grew {rss.growth / MB:.0f} MB"
    out_total, err_total = len("FIRST\n") + GB + len("\nLAST\n"), 10 + 100 * MB + 9
    assert result.truncated_bytes == out_total + err_total - 2 * DEFAULT_MAX_OUTPUT_BYTES
    for text, head, tail in (
        (result.stdout, "FIRST\nxxx", "xxx\nLAST\n"),
        (result.stderr, "ERR-FIRST\ne\ne", "e\ne\nERR-LAST\n"),
    ):
        assert "output capped" in text
        kept = kept_text(text)
        assert kept.startswith(head) and kept.endswith(tail)
        assert len(kept.encode()) <= DEFAULT_MAX_OUTPUT_BYTES
    nbformat.validate(nbformat.v4.new_notebook(cells=[shell_cell(command, result)]))
    assert (await py_sandbox.run_shell("echo ok")).stdout == "ok\n"


async def test_a_flood_of_images_keeps_the_first_and_one_placeholder(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image="kernel-sandbox:python", max_output_bytes=4 * MB)
    code = (
        "import base64\n"
        "from IPython.display import display\n"
        "png = base64.b64encode(b'\\x89PNG' + bytes(10**6)).decode()\n"
        "for i in range(300):\n"
        "    display({'image/png': png, 'text/plain': f'img {i}'}, raw=True)\n"
        "print('done')"
    )
    with PeakRss().measure() as rss:
        ex = await sandbox.run_python(code, timeout=600)
    assert ex.status == "ok", ex.message
    images = [o for o in ex.outputs if "image/png" in o.get("data", {})]
    placeholders = [o for o in ex.outputs if "rich output(s)" in str(o.get("data", {}))]
    assert len(images) == 3 and len(placeholders) == 1
    assert "297 rich output(s)" in placeholders[0]["data"]["text/plain"]
    assert ex.stdout == "done\n"
    assert rss.growth < HOST_BOUND
    nbformat.validate(nbformat.v4.new_notebook(cells=[python_cell(code, ex)]))


async def test_a_2_gb_file_is_refused_unread(py_sandbox: AsyncSandbox) -> None:
    await py_sandbox.run_shell("truncate -s 2G big.bin && echo small > small.txt")
    with PeakRss().measure() as rss, pytest.raises(FileOperationError) as caught:
        await py_sandbox.files.read("big.bin")
    assert "2.0 GB" in str(caught.value) and "max_file_bytes" in str(caught.value)
    assert rss.growth < HOST_BOUND
    assert await py_sandbox.files.read_text("small.txt") == "small\n"
    tools = ToolSet(py_sandbox)
    result = await tools.execute("file_operation", {"operation": "read", "file_path": "big.bin"})
    assert result.status == "error" and "max_file_bytes" in (result.error or "")


async def test_tools_tell_the_model_what_the_sandbox_dropped(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image="kernel-sandbox:python", max_output_bytes=1000)
    tools = ToolSet(sandbox)
    shell = await tools.execute("shell_executor", {"command": "seq 1 100000"})
    python = await tools.execute("python_executor", {"code": "for i in range(10**5): print(i)"})
    for result in (shell, python):
        assert result.ok, result.error
        assert result.metadata["truncated_bytes"] > 500_000
        assert result.output.splitlines()[-1].startswith("[output capped by the sandbox:")
