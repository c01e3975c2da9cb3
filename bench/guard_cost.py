"""What the connection guard (kernel/guard.py) costs a round trip: print(1+1) p50 with and
without it, in the same run, on two sandboxes taking turns (so load on the machine hits
both alike).  ``python bench/guard_cost.py [--calls N] [--transport ipc|tcp]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from kernel_sandbox.kernel import channels
from kernel_sandbox.sandbox import AsyncSandbox

BENCH_LABEL = {"kernel-sandbox.bench": "1"}


async def main(calls: int, transport: str, image: str) -> None:
    boxes = {}
    for guarded in (True, False):
        channels.GUARD_CONNECTIONS = guarded  # read when the host sockets are made
        boxes[guarded] = await AsyncSandbox.create(
            image=image, transport=transport, labels=BENCH_LABEL
        )
    channels.GUARD_CONNECTIONS = True
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for box in boxes.values():
            for _ in range(20):
                await box.run_python("print(1+1)")
        for _ in range(calls):
            for guarded, box in boxes.items():
                start = time.perf_counter()
                ex = await box.run_python("print(1+1)")
                times[guarded].append(time.perf_counter() - start)
                assert ex.stdout == "2\n", ex.text
    finally:
        for box in boxes.values():
            await box.close()
    for guarded, values in times.items():
        values.sort()
        print(
            f"{transport} guard={'on ' if guarded else 'off'}: print(1+1) "
            f"p50 {statistics.median(values) * 1000:.3f} ms, "
            f"p90 {values[int(len(values) * 0.9)] * 1000:.3f} ms ({len(values)} calls)"
        )
    cost = statistics.median(times[True]) - statistics.median(times[False])
    print(f"{transport}: the guard adds {cost * 1e6:+.0f} µs to the p50")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--transport", default="ipc", choices=["ipc", "tcp"])
    parser.add_argument("--image", default="kernel-sandbox:python")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.transport, args.image))
