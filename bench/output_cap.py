"""What 1 GB of output costs the host: wall time, host CPU time and peak RSS growth.

``python -m bench.output_cap [--gb N] [--image IMAGE]`` runs, in one sandbox, a cell
printing N GB in 1 MB lines and a shell command writing N GB to stdout, and prints
one JSON line per case.  The host keeps ``max_output_bytes`` (10 MiB) of each; the rest
is received and discarded, so the CPU time is the cost of the receive path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from typing import Any

from kernel_sandbox.sandbox import AsyncSandbox


def _peak_reset() -> int:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status_bytes("VmRSS:")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field))
    return int(line.split()[1]) * 1024


async def _measure(name: str, gb: int, call: Any) -> dict[str, Any]:
    before = _peak_reset()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    result = await call
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "case": name,
        "gigabytes": gb,
        "wall_s": round(wall, 2),
        "host_cpu_s": round(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime, 2),
        "peak_rss_growth_mb": round((_status_bytes("VmHWM:") - before) / 1024**2, 1),
        "truncated_bytes": result.truncated_bytes,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=int, default=1)
    parser.add_argument("--image", default="kernel-sandbox:python")
    args = parser.parse_args()
    cell = f"for i in range({args.gb * 1000}):\n    print('x' * (10**6 - 1))"
    shell = f"head -c {args.gb}G /dev/zero | tr '\\0' x"
    async with await AsyncSandbox.create(image=args.image, timeout=3600) as sandbox:
        for name, call in (
            ("python_print_1mb_lines", sandbox.run_python(cell)),
            ("shell_stdout", sandbox.run_shell(shell)),
        ):
            print(json.dumps(await _measure(name, args.gb, call)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
