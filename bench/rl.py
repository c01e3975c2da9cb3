"""An evaluation / RL-rollout workload: N sandboxes x M short cells, peers in the same run.

    python bench/rl.py                              # 16 x 200, all systems (~5 min)
    python bench/rl.py -n 16 -m 300 --systems ours,local
    python bench/rl.py --systems ours,autogen,smolagents -n 8 -m 100

Each system starts N sandboxes (``--start-concurrency`` at a time) and then drives all of
them at once, one caller per sandbox, each sending M cells that cycle through four
kinds an evaluation harness sends: an arithmetic expression, a small numpy op, a
printed table and a failing cell (a ZeroDivisionError traceback).  Every answer is
checked (a wrong or missing output counts in ``wrong``).  Reported per system:

- executions/s over the whole drive, and per core (``/ os.cpu_count()``);
- p50 / p99 of one call, as the caller waits for it;
- CPU-seconds per 1000 executions on the kernel side (each container's cgroup CPU
  usage, or the local kernel processes' own) and on the host side (the process that
  drives them: this one, or the peer's driver);
- sandboxes started per second (create -> ready to execute, ``--start-concurrency`` at a
  time).

Systems: ``ours`` (kernel_sandbox, the image's kernel under our launcher), ``local`` (a
stock ipykernel on this host, no container, driven by jupyter_client's async client:
what a plain-Jupyter user gets), and the stateful peers of bench/peers (AutoGen's
``DockerJupyterCodeExecutor``, smolagents' ``DockerExecutor``), each in its own
bench-only virtualenv.  All run one after the other in one run, so their ratios are
what to read on a shared machine.  JSON goes to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import peers  # noqa: E402
from peers.driver import RL_CELLS, RL_SETUP, cgroup_cpu, rl_check  # noqa: E402
from run import pct  # noqa: E402

SYSTEMS = ("ours", "local", "autogen", "smolagents")
DEFAULT_IMAGE = "kernel-sandbox:datascience"
TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """CPU seconds of one process (user + system, itself and its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICK


async def _drive(
    calls: list[Callable[[str], Awaitable[Any]]],
    m: int,
    kernel_cpu: Callable[[], float],
) -> dict[str, Any]:
    """M cells on every sandbox at once (one caller each); latencies, wrong answers, CPU."""
    latencies: list[float] = []
    wrong: list[str] = []

    async def one(call: Callable[[str], Awaitable[Any]]) -> None:
        for i in range(m):
            kind, code = RL_CELLS[i % len(RL_CELLS)]
            t = time.perf_counter()
            got = await call(code)
            latencies.append(time.perf_counter() - t)
            problem = rl_check(kind, got)
            if problem and len(wrong) < 20:
                wrong.append(problem)

    kernel0, host0, t0 = kernel_cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(c) for c in calls))
    wall = time.perf_counter() - t0
    host, kernel = time.process_time() - host0, kernel_cpu() - kernel0
    return _figures(len(latencies), wall, kernel, host, latencies, wrong)


def _figures(
    done: int, wall: float, kernel: float, host: float, latencies: list[float], wrong: list[str]
) -> dict[str, Any]:
    return {
        "executions": done,
        "seconds": wall,
        "per_second": done / wall,
        "kernel_cpu_s": kernel,
        "host_cpu_s": host,
        "latency": latencies,
        "wrong": wrong,
    }


async def ours(image: str, n: int, m: int, concurrency: int) -> dict[str, Any]:
    """kernel_sandbox: N AsyncSandboxes on the Docker engine."""
    from kernel_sandbox.config import SandboxConfig
    from kernel_sandbox.sandbox import AsyncSandbox

    config = SandboxConfig(image=image, labels={"kernel-sandbox.bench": "1"})
    await (await AsyncSandbox.create(config)).close()  # resolves the image, probes its user
    slots = asyncio.Semaphore(concurrency)

    async def make() -> AsyncSandbox:
        async with slots:
            return await AsyncSandbox.create(config)

    t0 = time.perf_counter()
    made = await asyncio.gather(*(make() for _ in range(n)), return_exceptions=True)
    started = time.perf_counter() - t0
    sandboxes = [s for s in made if isinstance(s, AsyncSandbox)]
    try:
        failed = [s for s in made if isinstance(s, BaseException)]
        if failed:
            raise failed[0]
        ids = [str(s.container_id) for s in sandboxes]
        for s in sandboxes:
            await s.run_python(RL_SETUP)

        def call(s: AsyncSandbox) -> Callable[[str], Awaitable[Any]]:
            async def run(code: str) -> Any:
                r = await s.run_python(code, timeout=60)
                return r.text, r.error.ename if r.error else None

            return run

        r = await _drive([call(s) for s in sandboxes], m, lambda: sum(map(cgroup_cpu, ids)))
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))
    return r | {"started_per_second": n / started, "start_seconds": started}


async def local(n: int, m: int, concurrency: int) -> dict[str, Any]:
    """Stock ipykernel on this host (no container) and jupyter_client's async client."""
    import shutil

    from jupyter_client.manager import AsyncKernelManager

    slots = asyncio.Semaphore(concurrency)
    run_dir = tempfile.mkdtemp(prefix="ks-bench-rl-")

    async def make(i: int) -> tuple[Any, Any]:
        async with slots:
            km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{run_dir}/k{i}")
            await km.start_kernel()
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            return km, kc

    t0 = time.perf_counter()
    kernels = await asyncio.gather(*(make(i) for i in range(n)))
    started = time.perf_counter() - t0
    pids = [km.provisioner.process.pid for km, _ in kernels]
    try:

        def call(kc: Any) -> Callable[[str], Awaitable[Any]]:
            async def run(code: str) -> Any:
                return await _jupyter_round_trip(kc, code)

            return run

        for _, kc in kernels:
            await _jupyter_round_trip(kc, RL_SETUP)
        r = await _drive([call(kc) for _, kc in kernels], m, lambda: sum(map(_proc_cpu, pids)))
    finally:
        for _, kc in kernels:
            kc.stop_channels()
        await asyncio.gather(*(km.shutdown_kernel(now=True) for km, _ in kernels))
        shutil.rmtree(run_dir, ignore_errors=True)
    return r | {"started_per_second": n / started, "start_seconds": started}


async def _jupyter_round_trip(kc: Any, code: str) -> tuple[str, str | None]:
    """What a jupyter_client user does: execute, collect iopub until idle, read the reply."""
    msg_id = kc.execute(code, store_history=True, allow_stdin=False)
    text: list[str] = []
    ename = None
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            text.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            ename = content["ename"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
    while True:
        reply = await kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return "".join(text).strip("\n"), ename


def peer(name: str, n: int, m: int, concurrency: int) -> dict[str, Any]:
    """A peer in its own virtualenv (bench/peers/driver.py ``rl``)."""
    try:
        return peers.measure_rl(name, n, m, concurrency)
    finally:
        peers.cleanup()


def rows(results: dict[str, dict[str, Any]], cpus: int) -> list[tuple[str, ...]]:
    header = (
        "system",
        "exec/s",
        "exec/s/core",
        "p50 / p99 ms",
        "kernel CPU-s/1000",
        "host CPU-s/1000",
        "exec per CPU-s",
        "started/s",
        "ours / it (exec/s)",
        "wrong",
    )
    lines: list[tuple[str, ...]] = [header, tuple("-" * len(h) for h in header)]
    base = results.get("ours", {}).get("per_second")
    for name, r in results.items():
        if "error" in r:
            last = r["error"].strip().splitlines()[-1]
            lines.append((name, "failed", "", last[:60], *[""] * (len(header) - 4)))
            continue
        k = 1000 / r["executions"]
        cpu = r["kernel_cpu_s"] + r["host_cpu_s"]
        lines.append(
            (
                name,
                f"{r['per_second']:.0f}",
                f"{r['per_second'] / cpus:.0f}",
                f"{pct(r['latency'], 50) * 1000:.2f} / {pct(r['latency'], 99) * 1000:.1f}",
                f"{r['kernel_cpu_s'] * k:.2f}",
                f"{r['host_cpu_s'] * k:.2f}",
                f"{r['executions'] / cpu:.0f}" if cpu else "-",
                f"{r['started_per_second']:.2f}"
                + (f" ({r['start_concurrency']} at once)" if "start_concurrency" in r else ""),
                f"{base / r['per_second']:.2f}x" if base else "-",
                str(len(r["wrong"])),
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-n", type=int, default=16, help="sandboxes (default: %(default)s)")
    p.add_argument("-m", type=int, default=200, help="cells per sandbox (default: %(default)s)")
    p.add_argument("--start-concurrency", type=int, default=4, help="sandboxes starting at once")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {SYSTEMS}")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="our sandbox image")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/)")
    args = p.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    started = time.time()
    load0 = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    n, m, c = args.n, args.m, args.start_concurrency
    for name in systems:
        print(f"[{time.time() - started:6.1f}s] {name}: {n} x {m} cells", file=sys.stderr)
        try:
            if name == "ours":
                results[name] = asyncio.run(ours(args.image, n, m, c))
            elif name == "local":
                results[name] = asyncio.run(local(n, m, c))
            else:
                results[name] = peer(name, n, m, c)
        except Exception as exc:  # reported in the table; the other systems stand
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    cpus = os.cpu_count() or 1
    lines = rows(results, cpus)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    load = " -> ".join("/".join(f"{x:.1f}" for x in la) for la in (load0, os.getloadavg()))
    seconds = time.time() - started
    print(
        f"\n{n} sandboxes x {m} cells ({', '.join(k for k, _ in RL_CELLS)}), "
        f"{c} starting at a time; {cpus} CPUs, load average {load}, {seconds:.0f} s"
    )
    for name, r in results.items():
        for problem in r.get("wrong", [])[:3]:
            print(f"  {name} wrong: {problem}")
        if r.get("start_failures"):
            print(f"  {name}: {len(r['start_failures'])} starts failed and were retried")
    out = args.out or HERE / "results" / time.strftime("rl-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python bench/rl.py " + " ".join(sys.argv[1:] if argv is None else argv)
    summary = {
        name: {k: v for k, v in r.items() if k != "latency"}
        | ({"p50": pct(r["latency"], 50), "p99": pct(r["latency"], 99)} if "latency" in r else {})
        for name, r in results.items()
    }
    payload = {
        "command": command.strip(),
        "load": [load0, os.getloadavg()],
        "summary": summary,
        "raw": results,
    }
    out.write_text(json.dumps(payload, indent=1, default=str))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
