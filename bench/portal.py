"""Sync facade: our hand-made portal thread against anyio's blocking portal, same run.

    PYTHONPATH=$PWD python bench/portal.py --calls 400

Each side owns one sandbox created on its own portal loop (a kernel's sockets belong
to the loop that opened them) and runs ``print(1+1)`` through it ``--calls`` times,
in interleaved rounds so that load on the machine hits both alike.  A second pair of
figures calls an empty coroutine: the cost of the portal alone, without the kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from anyio.from_thread import start_blocking_portal

from kernel_sandbox import AsyncSandbox, Sandbox
from kernel_sandbox.sync import run_sync

LABELS = {"kernel-sandbox.bench": "portal"}


async def _noop() -> None:
    return None


def _timed(call: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def _summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "calls": len(ms),
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(len(ms) * 0.9)], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def measure(image: str, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per-call seconds for each portal, kernel round trip and empty coroutine."""
    per_round = max(1, calls // rounds)
    times: dict[str, list[float]] = {k: [] for k in ("ours", "anyio", "ours_noop", "anyio_noop")}
    with start_blocking_portal(backend="asyncio") as portal:
        ours = Sandbox.create(image=image, labels=LABELS)
        theirs = portal.call(lambda: AsyncSandbox.create(image=image, labels=LABELS))
        try:
            for check in (
                ours.run_python("print(1+1)"),
                portal.call(theirs.run_python, "print(1+1)"),
            ):
                assert check.stdout == "2\n", check
            for _ in range(rounds):
                times["ours"] += _timed(lambda: ours.run_python("print(1+1)"), per_round)
                times["anyio"] += _timed(
                    lambda: portal.call(theirs.run_python, "print(1+1)"), per_round
                )
                times["ours_noop"] += _timed(lambda: run_sync(_noop()), per_round)
                times["anyio_noop"] += _timed(lambda: portal.call(_noop), per_round)
        finally:
            ours.close()
            portal.call(theirs.close)
    return {name: _summary(samples) for name, samples in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="kernel-sandbox:python")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(measure(args.image, args.calls, args.rounds), indent=2))


if __name__ == "__main__":
    main()
