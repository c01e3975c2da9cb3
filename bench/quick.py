"""``make bench-quick``: the key ratios in under two minutes, checked against a baseline.

    python bench/quick.py                 # measure, print, compare with the baseline
    python bench/quick.py --update        # ... and write the figures as the new baseline

The machine is shared and loaded, so every figure that gates is a ratio to a baseline
measured in the same run, interleaved with ours:

- ``print_vs_local``: our ``print(1+1)`` round trip p50 / a stock local ipykernel's
  (driven by plain jupyter_client, no container), lower is better;
- ``cold_vs_docker``: create -> first result p50 / ``docker run --rm IMAGE true`` p50,
  lower is better;
- ``throughput16_x_local``: short executions per second over 16 sandboxes times the
  local kernel's round trip p50, higher is better: printed, not gated (``REPORTED``).

Each gated ratio has a margin (``MARGINS``): a ratio worse than the committed
``bench/results/baseline.json`` by more than it exits 1.  The margins are wide because
the ratios still move with the load (print ±30 %, cold start up to +55 % between runs
of the same code at load 12-25 on 2 cores here), so the gate catches large regressions
only; the absolute figures are printed for the record only.  Under two minutes even at
load 25 (~35 s on a quiet machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402
import ours  # noqa: E402
from run import pct  # noqa: E402

from kernel_sandbox.sandbox import AsyncSandbox  # noqa: E402

BASELINE = HERE / "results" / "baseline.json"
#: metric -> (direction, allowed regression as a fraction of the baseline value)
MARGINS: dict[str, tuple[str, float]] = {
    "print_vs_local": ("lower", 0.35),
    "cold_vs_docker": ("lower", 0.60),
}
#: Printed beside the gated ratios but never failing the run: at load 12-15 it moved from
#: 0.74 to 2.38 between two runs of the same code (the local round trip and the 16
#: sandboxes are measured at different moments of a load that changes by the second).
REPORTED = ("throughput16_x_local",)


async def round_trips(image: str, calls: int) -> list[float]:
    """print(1+1) round trips on one warm sandbox."""
    async with await AsyncSandbox.create(ours.config(image)) as sandbox:
        for _ in range(20):
            await sandbox.run_python("print(1+1)")
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            ex = await sandbox.run_python("print(1+1)")
            out.append(time.perf_counter() - t)
        assert ex.text == "2", ex.text
        return out


async def cold(image: str, n: int) -> tuple[list[float], list[float]]:
    """Our create -> first result and a bare ``docker run``, taking turns, n times each."""
    ours_s: list[float] = []
    docker_s: list[float] = []
    for _ in range(n):
        docker_s += await asyncio.to_thread(baselines.docker_run_true, image, 1)
        t0 = time.perf_counter()
        sandbox = await AsyncSandbox.create(ours.config(image))
        try:
            ex = await sandbox.run_python("print(1+1)")
            ours_s.append(time.perf_counter() - t0)
            assert ex.text == "2", ex.text
        finally:
            await sandbox.close()
    return ours_s, docker_s


async def measure(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    log(f"print(1+1) x {args.calls}: ours and a local stock ipykernel, interleaved halves")
    half = args.calls // 2
    ours_lat = await round_trips(args.image, half)
    local = (await baselines.local_kernel(args.calls, 1, tuned=False))["latency"]
    ours_lat += await round_trips(args.image, args.calls - half)
    raw["print"], raw["local_print"] = ours_lat, local
    log(f"cold start x {args.cold} against docker run --rm IMAGE true")
    raw["cold"], raw["docker_run_true"] = await cold(args.image, args.cold)
    log(f"throughput: 16 sandboxes, {args.seconds:g} s")
    raw["throughput"] = await ours.throughput(args.image, [16], args.seconds)
    return raw


def ratios(raw: dict[str, Any]) -> dict[str, float]:
    local = pct(raw["local_print"], 50)
    return {
        "print_vs_local": pct(raw["print"], 50) / local,
        "cold_vs_docker": pct(raw["cold"], 50) / pct(raw["docker_run_true"], 50),
        "throughput16_x_local": raw["throughput"]["16"] * local,
    }


def compare(now: dict[str, float], base: dict[str, float]) -> list[tuple[str, str, bool]]:
    """(metric, verdict line, regressed?) for every gated metric."""
    out = []
    for name, (direction, margin) in MARGINS.items():
        value, ref = now[name], base.get(name)
        if ref is None:
            out.append((name, f"{value:.3f} (no baseline)", False))
            continue
        limit = ref * (1 + margin) if direction == "lower" else ref * (1 - margin)
        bad = value > limit if direction == "lower" else value < limit
        change = (value - ref) / ref * 100
        word = "REGRESSED" if bad else "ok"
        sign = "<=" if direction == "lower" else ">="
        line = f"{value:.3f} vs {ref:.3f} ({change:+.0f}%; must stay {sign} {limit:.3f}) {word}"
        out.append((name, line, bad))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--image", default="kernel-sandbox:datascience")
    p.add_argument("--calls", type=int, default=600, help="print(1+1) round trips")
    p.add_argument("--cold", type=int, default=8, help="cold starts (and docker runs)")
    p.add_argument("--seconds", type=float, default=4.0, help="throughput measuring time")
    p.add_argument("--baseline", type=Path, default=BASELINE)
    p.add_argument("--update", action="store_true", help="write the result as the baseline")
    args = p.parse_args(argv)
    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - started:5.1f}s] {msg}", file=sys.stderr, flush=True)

    load = os.getloadavg()
    raw = asyncio.run(measure(args, log))
    now = ratios(raw)
    ms = 1000
    print(
        f"print(1+1) p50 {pct(raw['print'], 50) * ms:.2f} ms (local stock ipykernel "
        f"{pct(raw['local_print'], 50) * ms:.2f} ms); cold start p50 "
        f"{pct(raw['cold'], 50):.3f} s (docker run true {pct(raw['docker_run_true'], 50):.3f} s);"
        f" 16 sandboxes {raw['throughput']['16']:.0f} calls/s"
    )
    print(f"load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}, {time.time() - started:.0f} s")
    base = json.loads(args.baseline.read_text())["ratios"] if args.baseline.exists() else {}
    verdicts = compare(now, base)
    width = max(len(n) for n in now)
    for name, line, _ in verdicts:
        print(f"  {name:<{width}}  {line}")
    for name in REPORTED:
        ref = base.get(name)
        was = f" (baseline {ref:.3f}; reported, not gated)" if ref else ""
        print(f"  {name:<{width}}  {now[name]:.3f}{was}")
    if args.update:
        args.baseline.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "ratios": now,
            "margins": {k: list(v) for k, v in MARGINS.items()},
            "absolute": {
                "print_p50_ms": pct(raw["print"], 50) * ms,
                "local_print_p50_ms": pct(raw["local_print"], 50) * ms,
                "cold_p50_s": pct(raw["cold"], 50),
                "docker_run_true_p50_s": pct(raw["docker_run_true"], 50),
                "throughput16_per_s": raw["throughput"]["16"],
            },
            "loadavg": [load[0], os.getloadavg()[0]],
            "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        args.baseline.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"baseline written: {args.baseline}")
        return 0
    regressed = [n for n, _, bad in verdicts if bad]
    if regressed:
        print(f"bench-quick: regressed past the margin: {', '.join(regressed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
