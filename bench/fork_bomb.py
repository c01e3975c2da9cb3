"""How long a fork bomb takes to be ended by a kernel restart in place, per runtime.

    python -m bench.fork_bomb --runtime runsc --reps 3

The bomb ignores the interrupt and forks without end, retrying while ``pids_limit``
refuses; the call times out, the kernel does not stop, and its whole process group is
killed and the kernel restarted in place.  Two ways: forks of the kernel itself, and a
bomb in an interpreter of its own (``subprocess``), which leaves all the limit's places
to the bomb.  Each JSON line gives the seconds past the timeout until the call returned
(the price of ending it), whether the kernel was restarted in place (files kept), and
the peak of the container's host tasks (the engine's pids cgroup, read on a local
engine with cgroups v1; under gVisor the sentry's and its stub threads, see
``runtimes.gvisor_host_pids``).  Run with ``PYTHONPATH`` pointing at the checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from kernel_sandbox.sandbox import AsyncSandbox

BOMB = (
    "import os, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "while True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)"
)
WAYS = {
    "kernel": BOMB,
    "process": "import signal, subprocess, sys\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    f"subprocess.run([sys.executable, '-c', {BOMB!r}])",
}


async def _peak_tasks(container: str, peak: list[int]) -> None:
    current = Path(f"/sys/fs/cgroup/pids/docker/{container}/pids.current")
    while True:
        with contextlib.suppress(OSError, ValueError):
            peak[0] = max(peak[0], int(current.read_text()))
        await asyncio.sleep(0.2)


async def once(runtime: str | None, way: str, pids_limit: int, timeout: float) -> dict[str, Any]:
    """One bomb in a fresh sandbox (memory as the tests give it: 2g under gVisor)."""
    roomy = {"memory_limit": "2g"} if runtime and runtime.startswith("runsc") else {}
    async with await AsyncSandbox.create(
        image="kernel-sandbox:python",
        runtime=runtime,
        pids_limit=pids_limit,
        interrupt_grace=0.5,
        labels={"kernel-sandbox.bench": "1"},
        **roomy,  # type: ignore[arg-type]
    ) as sb:
        peak = [0]
        watch = asyncio.ensure_future(_peak_tasks(str(sb.host.resource_id), peak))
        started = time.monotonic()
        ex = await sb.run_python(WAYS[way], timeout=timeout)
        took = time.monotonic() - started
        watch.cancel()
        works = (await sb.run_python("2 * 21")).text == "42"
    return {
        "runtime": runtime or "default",
        "way": way,
        "pids_limit": pids_limit,
        "timeout": timeout,
        "ended_after_timeout_s": round(took - timeout, 2),
        "in_place": "restarted" in ex.message and "files" not in ex.message,
        "works_after": works,
        "peak_host_tasks": peak[0] or None,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=None, help="e.g. runsc (default: the engine's)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pids-limit", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=15.0)
    parser.add_argument("--ways", default="kernel,process")
    args = parser.parse_args()
    for way in args.ways.split(","):
        for _ in range(args.reps):
            print(json.dumps(await once(args.runtime, way, args.pids_limit, args.timeout)))


if __name__ == "__main__":
    asyncio.run(main())
