"""How long a kernel restart takes, per cause: explicit, crash, stuck (ignores SIGINT).

    python bench/restart.py --reps 5

Each figure is the wall time of one call, minus the timeout and interrupt grace the
call spends waiting on purpose (stuck case), so it is the price of the restart itself.
Run with ``PYTHONPATH`` pointing at the checkout to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from kernel_sandbox import AsyncSandbox

STUCK = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
TIMEOUT, GRACE = 1.0, 0.5


async def measure(image: str, reps: int) -> dict[str, list[float]]:
    """Seconds per restart for each cause, ``reps`` times each, on one sandbox."""
    times: dict[str, list[float]] = {"explicit": [], "crash": [], "stuck": []}
    async with await AsyncSandbox.create(
        image=image, interrupt_grace=GRACE, labels={"kernel-sandbox.bench": "1"}
    ) as sb:
        for _ in range(reps):
            started = time.monotonic()
            await sb.restart()
            times["explicit"].append(time.monotonic() - started)

            started = time.monotonic()
            ex = await sb.run_python("import os; os._exit(3)")
            times["crash"].append(time.monotonic() - started)
            assert ex.status == "kernel_died" and "restarted" in ex.message, ex.message

            started = time.monotonic()
            ex = await sb.run_python(STUCK, timeout=TIMEOUT)
            times["stuck"].append(time.monotonic() - started - TIMEOUT - GRACE)
            assert ex.status == "timeout" and ex.state_lost, ex.message
            assert (await sb.run_python("1 + 1")).text == "2"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="kernel-sandbox:python")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    times = asyncio.run(measure(args.image, args.reps))
    summary = {
        cause: {"median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3)}
        for cause, v in times.items()
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
