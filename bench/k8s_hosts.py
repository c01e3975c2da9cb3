"""Kubernetes beside Docker, in the same run: create -> first result, print(1+1), pool acquire.

    python bench/k8s_hosts.py                  # KUBECONFIG, or the local cluster
    python bench/k8s_hosts.py --calls 200 --creates 5 --hosts kubernetes

Needs a cluster (``scripts/k8s/cluster.sh up`` starts the local one and prints its
KUBECONFIG) and the Docker engine for the Docker figures.  Sandboxes run in the namespace
``kernel-sandbox-bench`` (created if missing; ``KERNEL_SANDBOX_NAMESPACE`` overrides it).
JSON goes to bench/results/kubernetes-<time>.json.  Figures are measurements on whatever
else the machine is doing: compare the two columns, not runs on different days.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernel_sandbox.pool import SandboxPool  # noqa: E402
from kernel_sandbox.sandbox import AsyncSandbox  # noqa: E402

LABELS = {"kernel-sandbox.bench": "kubernetes"}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def create_to_first_result(host: str, image: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        sb = await AsyncSandbox.create(host=host, image=image, labels=LABELS)
        try:
            ex = await sb.run_python("print(1 + 1)")
            assert ex.stdout == "2\n", ex
            times.append(time.perf_counter() - started)
        finally:
            await sb.close()
    return times


async def round_trips(host: str, image: str, calls: int) -> list[float]:
    sb = await AsyncSandbox.create(host=host, image=image, labels=LABELS)
    try:
        for _ in range(5):
            await sb.run_python("print(1 + 1)")
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await sb.run_python("print(1 + 1)")
            times.append(time.perf_counter() - started)
        return times
    finally:
        await sb.close()


async def pool_acquire(host: str, image: str, n: int) -> list[float]:
    times = []
    async with SandboxPool(size=2, image=image, labels=LABELS, host=host) as pool:
        while pool.stats().idle < 2:
            await asyncio.sleep(0.05)
        for _ in range(n):
            started = time.perf_counter()
            sb = await pool.acquire()
            times.append(time.perf_counter() - started)
            await pool.release(sb)
            deadline = time.monotonic() + 120
            while pool.stats().idle < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    return times


def ensure_namespace() -> str:
    from kernel_sandbox.backends.kubernetes.api import ApiException, kube

    name = os.environ.setdefault("KERNEL_SANDBOX_NAMESPACE", "kernel-sandbox-bench")
    try:
        kube().core.create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return name


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for host in args.hosts.split(","):
        print(f"[{host}] create -> first result x{args.creates}", flush=True)
        cold = await create_to_first_result(host, args.image, args.creates)
        print(f"[{host}] print(1+1) x{args.calls}", flush=True)
        rtt = await round_trips(host, args.image, args.calls)
        print(f"[{host}] pool acquire x{args.acquires}", flush=True)
        acquire = await pool_acquire(host, args.image, args.acquires)
        out[host] = {
            "create_to_first_result_s": {"p50": statistics.median(cold), "max": max(cold)},
            "print_1_plus_1_ms": {"p50": pct(rtt, 50) * 1e3, "p95": pct(rtt, 95) * 1e3},
            "pool_acquire_ms": {"p50": pct(acquire, 50) * 1e3, "p95": pct(acquire, 95) * 1e3},
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="docker,kubernetes")
    parser.add_argument("--image", default="kernel-sandbox:python")
    parser.add_argument("--creates", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--acquires", type=int, default=10)
    args = parser.parse_args()
    if "kubernetes" in args.hosts and not os.environ.get("KUBECONFIG"):
        cluster = HERE.parent / "scripts" / "k8s" / "cluster.sh"
        os.environ["KUBECONFIG"] = subprocess.run(
            [str(cluster), "kubeconfig"], capture_output=True, text=True, check=True
        ).stdout.strip()
    if "kubernetes" in args.hosts:
        ensure_namespace()
    results = asyncio.run(measure(args))
    hosts = list(results)
    print(f"\n{'measure':<32}" + "".join(f"{h:>14}" for h in hosts))
    rows = (
        ("create -> first result (s, p50)", "create_to_first_result_s", "p50", "{:.2f}"),
        ("print(1+1) round trip (ms, p50)", "print_1_plus_1_ms", "p50", "{:.1f}"),
        ("print(1+1) round trip (ms, p95)", "print_1_plus_1_ms", "p95", "{:.1f}"),
        ("warm-pool acquire (ms, p50)", "pool_acquire_ms", "p50", "{:.2f}"),
    )
    for label, key, q, fmt in rows:
        print(f"{label:<32}" + "".join(f"{fmt.format(results[h][key][q]):>14}" for h in hosts))
    target = HERE / "results" / f"kubernetes-{time.strftime('%Y%m%d-%H%M%S')}.json"
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"\nJSON: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
