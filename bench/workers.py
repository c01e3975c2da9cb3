"""``serve --workers 1`` vs ``--workers 2`` in one run: throughput, p99, first call elsewhere.

    python bench/workers.py                           # 50 clients x 20 calls, 10 probes
    python bench/workers.py --clients 50 --per-client 40 --probes 20

For each worker count, a fresh server: N clients, each on its own sandbox and its own
kept-alive connection (so the clients spread over the workers as the kernel hands out
connections), ``print(1+1)`` in a loop: calls/s and p50/p99 (bench/server.py's
``concurrent``).  Then, with two workers, the cost of serving a sandbox another worker
made: a sandbox is created, and calls on connections of their own (any worker may take
each) run until one lands on the worker that did not create it; its first call there
adopts the sandbox on demand (labels, kernel connection, notebook), later ones find it
cached.  Reported: p50 of the creator's calls, of a first call elsewhere, and of later
calls elsewhere (every call pays a new connection, alike).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import httpx2  # noqa: E402
from server import KEY, concurrent, start_server  # noqa: E402

from kernel_sandbox.server.restart import remove_leftovers  # noqa: E402
from kernel_sandbox.server.workers import WORKER_HEADER  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def fresh_call(
    url: str, path: str, body: dict[str, object]
) -> tuple[float, str, dict[str, object]]:
    """One call on a connection of its own: (seconds, the worker that answered, answer)."""
    headers = {"X-API-Key": KEY, "Connection": "close"}
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
        t = time.perf_counter()
        r = await c.post(path, json=body)
        took = time.perf_counter() - t
    r.raise_for_status()
    return took, r.headers[WORKER_HEADER], r.json()


async def elsewhere(url: str, probes: int) -> dict[str, float]:
    """p50 (ms) of calls on the creator, a first call elsewhere, later calls elsewhere."""
    own: list[float] = []
    first: list[float] = []
    later: list[float] = []
    for _ in range(probes):
        _, maker, made = await fresh_call(url, "/v1/sandboxes", {})
        sid = made["id"]
        code = {"code": "print(1+1)"}
        seen_other = 0
        for _ in range(200):
            took, worker, _ = await fresh_call(url, f"/v1/sandboxes/{sid}/python", code)
            if worker == maker:
                own.append(took)
            elif seen_other == 0:
                first.append(took)
                seen_other = 1
            else:
                later.append(took)
                seen_other += 1
            if seen_other >= 4 and len(own) >= 3:
                break
        async with httpx2.AsyncClient(base_url=url, headers={"X-API-Key": KEY}) as c:
            await c.delete(f"/v1/sandboxes/{sid}")

    def p50(values: list[float]) -> float:
        return statistics.median(values) * 1000 if values else float("nan")

    return {
        "probes": probes,
        "creator_p50_ms": p50(own),
        "first_elsewhere_p50_ms": p50(first),
        "later_elsewhere_p50_ms": p50(later),
        "first_elsewhere_added_ms": p50(first) - p50(later),
    }


async def one_server(workers: int, args: argparse.Namespace) -> dict[str, object]:
    port, name = free_port(), f"bench-workers-{os.getpid()}-{workers}"
    extra = ("--workers", str(workers), "--max-calls-per-key", str(2 * args.clients))
    proc = start_server(port, name, extra=extra)
    url = f"http://127.0.0.1:{port}"
    try:
        figures: dict[str, object] = {"workers": workers, "load_1min": os.getloadavg()[0]}
        figures["concurrent"] = await concurrent(url, args.clients, args.per_client)
        if workers > 1:
            figures["elsewhere"] = await elsewhere(url, args.probes)
        return figures
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        await remove_leftovers(name)


async def main(args: argparse.Namespace) -> dict[str, object]:
    runs = [await one_server(n, args) for n in args.workers]
    base = runs[0]["concurrent"]["calls_per_s"]  # type: ignore[index]
    for run in runs:
        run["throughput_ratio"] = run["concurrent"]["calls_per_s"] / base  # type: ignore[index]
    return {"cpus": os.cpu_count(), "runs": runs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--per-client", type=int, default=20)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    figures = asyncio.run(main(parser.parse_args()))
    print(json.dumps(figures, indent=2))
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"workers-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps(figures, indent=2)
    )
