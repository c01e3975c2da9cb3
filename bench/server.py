"""Server benchmark: ``print(1+1)`` in-process vs through the HTTP server and MCP.

    python bench/server.py                      # 200 calls each, 50 clients x 20 calls
    python bench/server.py --calls 500 --clients 50 --per-client 40

One run measures, on the same machine and image, taking turns call by call (so a
shared machine's changing load weighs on all alike): the in-process round trip
(``AsyncSandbox.run_python``), the native HTTP API (``RemoteSandbox.run_python``),
ms-enclave's ``POST /sandbox/tool/execute`` and an MCP ``tools/call`` over streamable
HTTP, each over one kept-alive connection; then N concurrent clients, each on its own
sandbox: throughput and p50/p99.  ``--server-root`` runs the server from another
checkout (a before/after comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from kernel_sandbox import AsyncSandbox  # noqa: E402
from kernel_sandbox.client.remote import RemoteSandbox  # noqa: E402
from kernel_sandbox.server.restart import remove_leftovers  # noqa: E402

KEY = "bench-key"
IMAGE = "kernel-sandbox:python"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def start_server(
    port: int, name: str, root: Path = ROOT, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "kernel_sandbox.cli.main", "serve", "--port", str(port),
            "--api-key", KEY, "--name", name, "--image", IMAGE, "--max-sandboxes", "80",
            "--max-sandboxes-per-key", "80", "--record-dir", "/tmp/ks-bench-notebooks",
            *extra]  # fmt: skip
    proc = subprocess.Popen(args, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    for _ in range(300):
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", headers={"X-API-Key": KEY}).is_success:
                return proc
        except httpx2.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


@contextlib.asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[Any]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={"X-API-Key": KEY}, timeout=120) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def interleaved(n: int, calls: dict[str, Any]) -> dict[str, list[float]]:
    """Each call ``n`` times, taking turns: a load that comes and goes (a shared
    machine) weighs on every route alike, so their differences are the routes'."""
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(5):  # warm-up
        for call in calls.values():
            await call()
    for _ in range(n):
        for label, call in calls.items():
            t = time.perf_counter()
            await call()
            times[label].append(time.perf_counter() - t)
    return times


async def concurrent(url: str, clients: int, per_client: int) -> dict[str, float]:
    gate = asyncio.Semaphore(8)  # start them a few at a time, as `alive` does locally

    async def start() -> RemoteSandbox:
        async with gate:
            return await RemoteSandbox.create(url, api_key=KEY)

    sandboxes = await asyncio.gather(*(start() for _ in range(clients)))
    latencies: list[float] = []

    async def one(sb: RemoteSandbox) -> None:
        for _ in range(per_client):
            t = time.perf_counter()
            ex = await sb.run_python("print(1+1)")
            latencies.append(time.perf_counter() - t)
            assert ex.stdout == "2\n"

    started = time.perf_counter()
    await asyncio.gather(*(one(sb) for sb in sandboxes))
    wall = time.perf_counter() - started
    await asyncio.gather(*(sb.close() for sb in sandboxes))
    return {
        "clients": clients,
        "calls": len(latencies),
        "calls_per_s": len(latencies) / wall,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
    }


async def main(args: argparse.Namespace) -> dict[str, object]:
    results: dict[str, object] = {}
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    name = f"bench-{os.getpid()}"
    proc = start_server(number, name, Path(args.server_root).resolve())
    url = f"http://127.0.0.1:{number}"
    code = "print(1+1)"
    try:
        async with (
            await AsyncSandbox.create(image=IMAGE) as local,
            await RemoteSandbox.create(url, api_key=KEY) as remote,
            httpx2.AsyncClient(base_url=url, headers={"X-API-Key": KEY}, timeout=120) as c,
            mcp_session(url) as session,
        ):
            made = await c.post(
                "/sandbox/create",
                params={"sandbox_type": "docker"},
                json={"tools_config": ["python_executor"]},
            )
            body = {"sandbox_id": made.json()["sandbox_id"], "tool_name": "python_executor",
                    "parameters": {"code": code}}  # fmt: skip
            times = await interleaved(
                args.calls,
                {
                    "in-process": lambda: local.run_python(code),
                    "HTTP /v1 (RemoteSandbox)": lambda: remote.run_python(code),
                    "HTTP ms-enclave tool/execute": lambda: c.post(
                        "/sandbox/tool/execute", json=body
                    ),
                    "MCP streamable HTTP": lambda: session.call_tool("run_python", {"code": code}),
                },
            )
        base = statistics.median(times["in-process"]) * 1000
        for label, values in times.items():
            p50 = pct(values, 50)
            results[label] = {"p50_ms": p50, "p99_ms": pct(values, 99), "added_p50_ms": p50 - base}
        results["load_1min"] = os.getloadavg()[0]
        results["concurrent"] = await concurrent(url, args.clients, args.per_client)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        await remove_leftovers(name)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--per-client", type=int, default=20)
    parser.add_argument("--server-root", default=str(ROOT), help="checkout the server runs from")
    figures = asyncio.run(main(parser.parse_args()))
    print(json.dumps(figures, indent=2))
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"server-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps(figures, indent=2)
    )
