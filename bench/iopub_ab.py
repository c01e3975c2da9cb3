"""The kernel's direct IOPub path against ipykernel's own, in one run (issue 28).

    python bench/iopub_ab.py --rounds 6 --calls 100

Two sandboxes of the image, one with ``KERNEL_SANDBOX_IOPUB=thread`` (stock ipykernel's
hand-offs), one with the default direct path, take turns sending blocks of
``print(1+1)``; prints each one's p50 and the kernel's CPU per call (the container's
cgroup).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from peers.driver import cgroup_cpu  # noqa: E402

from kernel_sandbox.config import SandboxConfig  # noqa: E402
from kernel_sandbox.sandbox import AsyncSandbox  # noqa: E402


async def main(image: str, rounds: int, calls: int) -> None:
    boxes: dict[str, AsyncSandbox] = {}
    for mode in ("thread", "direct"):
        config = SandboxConfig(
            image=image,
            labels={"kernel-sandbox.bench": "1"},
            env_vars={"KERNEL_SANDBOX_IOPUB": mode},
        )
        boxes[mode] = await AsyncSandbox.create(config)
    lat: dict[str, list[float]] = {m: [] for m in boxes}
    cpu = dict.fromkeys(boxes, 0.0)
    try:
        for s in boxes.values():
            for _ in range(50):
                await s.run_python("print(1+1)")
        for turn in range(rounds):
            order = list(boxes.items())
            for mode, s in order if turn % 2 == 0 else order[::-1]:
                before = cgroup_cpu(str(s.container_id))
                for _ in range(calls):
                    t = time.perf_counter()
                    r = await s.run_python("print(1+1)")
                    lat[mode].append(time.perf_counter() - t)
                    assert r.text == "2", r
                cpu[mode] += cgroup_cpu(str(s.container_id)) - before
        for mode in boxes:
            p50 = statistics.median(lat[mode]) * 1000
            per_call = cpu[mode] / len(lat[mode]) * 1000
            print(f"{mode}: print(1+1) p50 {p50:.2f} ms, kernel CPU {per_call:.3f} ms a call")
        ratio = statistics.median(lat["thread"]) / statistics.median(lat["direct"])
        print(f"thread / direct: p50 {ratio:.2f}x, CPU {cpu['thread'] / cpu['direct']:.2f}x")
    finally:
        await asyncio.gather(*(s.close() for s in boxes.values()))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--image", default="kernel-sandbox:datascience")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=100)
    a = p.parse_args()
    asyncio.run(main(a.image, a.rounds, a.calls))
