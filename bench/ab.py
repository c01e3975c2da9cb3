"""A/B of two checkouts of kernel_sandbox on this machine, alternating, in one run.

On a shared, loaded machine a figure moves more between two runs than most changes move
it, so old and new run turn about (separate processes, each importing its own checkout)
and the medians are compared.  Three measures:

    python bench/ab.py cold --old /work/main --rounds 6 --per-round 3
        create -> first result of print(1+1), and the kernel's own CPU until then, with
        ``docker run --rm IMAGE true`` between the turns (the ratio of issue 17)
    python bench/ab.py start --old /work/main -n 100 -c 16 --rounds 2
        n sandboxes started c at a time (ABBA), with the CPU each party spent per start:
        kernels, dockerd, containerd, the new containers' shims, the owning process
    python bench/ab.py calls --old /work/main -n 16 --seconds 5 --rounds 3
        x += 1 on n sandboxes, one caller each: calls/s and the owning process's CPU a call
    python bench/ab.py paced --old /work/main -n 200 --gap 0.7 --rounds 1
        print(1+1) on one sandbox, n calls --gap seconds apart (an agent's pace, not a
        loop's): p50, p99, max and the calls over 100 ms (a call that waits for a poll)
    python bench/ab.py roundtrip --old /work/main -n 1000 --rounds 4 [--local] [--code C]
        print(1+1) (or the cell C, e.g. '1 / 0') back to back on one sandbox (--local: a
        local ipykernel with the launcher's flags, no container) through the checkout's
        KernelSession: p50, and the CPU per call of the host process, of its main thread
        (the event loop) and of the kernel (its process: the container's, or the local
        one's)

``--new`` defaults to this checkout.  The one-checkout parts run as
``python bench/ab.py _cold|_start|_calls|_paced ...`` in a child with ``PYTHONPATH`` set.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IMAGE = "kernel-sandbox:datascience"
LABELS = {"kernel-sandbox.bench": "1"}
#: The cell of the round trips unless --code says another.
PRINT = "print(1+1)"
KERNEL_CPU = (
    "import resource; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
)
TICK = os.sysconf("SC_CLK_TCK")


def _config(image: str) -> Any:
    from kernel_sandbox.config import SandboxConfig

    return SandboxConfig(image=image, labels=dict(LABELS))


async def _cold(image: str, k: int) -> list[tuple[float, float]]:
    from kernel_sandbox.sandbox import AsyncSandbox

    async def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        sandbox = await AsyncSandbox.create(_config(image))
        first = await sandbox.run_python("print(1+1)")
        took = time.perf_counter() - t0
        assert first.text == "2", first
        cpu = float((await sandbox.run_python(KERNEL_CPU)).text)
        await sandbox.close()
        return took, cpu

    await one()  # the process's first start resolves the image and probes its user
    return [await one() for _ in range(k)]


def _cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and of its reaped children (a shim's runc calls)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICK


def _pids(name: str) -> list[int]:
    """Processes called ``name`` that belong to Docker (not the Kubernetes containerd)."""
    found = []
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            if Path(comm).read_text().strip() != name:
                continue
            command = Path(comm).with_name("cmdline").read_bytes()
            if name == "dockerd" or b"moby" in command or b"/var/run/docker" in command:
                found.append(int(comm.split("/")[2]))
        except (OSError, ValueError):
            pass
    return found


def _busy() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK


async def _start(image: str, n: int, c: int) -> dict[str, float]:
    from kernel_sandbox.sandbox import AsyncSandbox

    daemons = {name: _pids(name) for name in ("dockerd", "containerd")}
    before = {name: sum(_cpu(p) for p in pids) for name, pids in daemons.items()}
    shims = set(_pids("containerd-shim"))
    own, busy, t0 = os.times(), _busy(), time.perf_counter()
    slots = asyncio.Semaphore(c)

    async def one() -> Any:
        async with slots:
            return await AsyncSandbox.create(_config(image))

    sandboxes = await asyncio.gather(*(one() for _ in range(n)))
    took = time.perf_counter() - t0
    own_after, busy_after = os.times(), _busy()
    out = {"seconds": took, "per_second": n / took, "load": os.getloadavg()[0]}
    for name, pids in daemons.items():
        out[f"{name}_cpu"] = (sum(_cpu(p) for p in pids) - before[name]) / n
    out["shims_cpu"] = sum(_cpu(p) for p in _pids("containerd-shim") if p not in shims) / n
    out["owner_cpu"] = (own_after.user + own_after.system - own.user - own.system) / n
    out["machine_busy"] = (busy_after - busy) / n
    kernels = [float((await s.run_python(KERNEL_CPU)).text) for s in sandboxes]
    out["kernel_cpu"] = statistics.mean(kernels)

    async def close(sandbox: Any) -> None:
        async with slots:
            await sandbox.close()

    await asyncio.gather(*(close(s) for s in sandboxes))
    return out


async def _calls(image: str, n: int, seconds: float) -> dict[str, float]:
    from kernel_sandbox.sandbox import AsyncSandbox

    slots = asyncio.Semaphore(4)

    async def make() -> Any:
        async with slots:
            return await AsyncSandbox.create(_config(image))

    sandboxes = await asyncio.gather(*(make() for _ in range(n)))
    try:
        for s in sandboxes:
            await s.run_python("x = 0")
        done, stop = 0, time.perf_counter() + seconds

        async def drive(sandbox: Any) -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await sandbox.run_python("x += 1")
                done += 1

        cpu, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(drive(s) for s in sandboxes))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
        return {"per_second": done / wall, "owner_cpu_ms": 1000 * cpu / done}
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def _paced(image: str, n: int, gap: float) -> dict[str, float]:
    from kernel_sandbox.sandbox import AsyncSandbox

    async with await AsyncSandbox.create(_config(image)) as sandbox:
        await sandbox.run_python("1")
        took = []
        for _ in range(n):
            t0 = time.perf_counter()
            await sandbox.run_python("print(1+1)")
            took.append(1000 * (time.perf_counter() - t0))
            await asyncio.sleep(gap)
    took.sort()
    return {
        "p50_ms": statistics.median(took),
        "p99_ms": took[max(0, round(0.99 * n) - 1)],
        "max_ms": took[-1],
        "over_100_ms": sum(t > 100 for t in took),
    }


async def _roundtrip(image: str, n: int, local: bool, code: str) -> dict[str, float]:
    from kernel_sandbox.kernel.client import KernelSession

    async def alive() -> None:
        return None

    closing: list[Any] = []
    if local:
        from jupyter_client.manager import AsyncKernelManager

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from baselines import TUNED_KERNEL_ARGS

        run_dir = tempfile.mkdtemp(prefix="ks-ab-")
        km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{run_dir}/k")
        await km.start_kernel(extra_arguments=TUNED_KERNEL_ARGS)
        session = KernelSession(km.get_connection_info())  # type: ignore[arg-type]
        await session.connect(60, alive)
        pid = km.provisioner.process.pid  # type: ignore[union-attr]

        def kernel_cpu() -> float:
            return _cpu(pid)

        closing.append(lambda: km.shutdown_kernel(now=True))
    else:
        from kernel_sandbox.sandbox import AsyncSandbox

        sandbox = await AsyncSandbox.create(_config(image))
        closing.append(sandbox.close)
        session = sandbox._kernel.session
        cgroup = Path(f"/sys/fs/cgroup/cpuacct/docker/{sandbox.container_id}/cpuacct.usage")

        def kernel_cpu() -> float:
            return int(cgroup.read_text()) / 1e9 if cgroup.exists() else 0.0

    async def call() -> None:
        raw = await session.execute(code, timeout=30, interrupt_grace=2, check_alive=alive)
        assert raw.outcome == "finished", raw
        assert code != PRINT or raw.outputs[0]["text"] == "2\n", raw

    try:
        for _ in range(100):
            await call()
        took = []
        kernel, process, thread = kernel_cpu(), time.process_time(), time.thread_time()
        for _ in range(n):
            t0 = time.perf_counter()
            await call()
            took.append(1000 * (time.perf_counter() - t0))
        process, thread = time.process_time() - process, time.thread_time() - thread
        kernel = kernel_cpu() - kernel
    finally:
        session.close()
        for close in closing:
            await close()
    return {
        "p50_ms": statistics.median(took),
        "host_cpu_ms": 1000 * process / n,
        "loop_thread_cpu_ms": 1000 * thread / n,
        "kernel_cpu_ms": 1000 * kernel / n,
    }


def _child(tree: str, *args: str) -> Any:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run(
        [sys.executable, __file__, *args], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{tree}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _docker_true(image: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parts = ("cold", "start", "calls", "paced", "roundtrip")
    p.add_argument("part", choices=(*parts, *(f"_{part}" for part in parts)))
    p.add_argument("--old", default="/work/main", help="the checkout to compare against")
    p.add_argument("--new", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--image", default=IMAGE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-round", type=int, default=3, help="cold starts per turn")
    p.add_argument("-n", type=int, default=16, help="sandboxes (start, calls)")
    p.add_argument("-c", type=int, default=16, help="starting at a time (start)")
    p.add_argument("--seconds", type=float, default=5.0, help="driving time (calls)")
    p.add_argument("--gap", type=float, default=0.7, help="seconds between calls (paced)")
    p.add_argument("--local", action="store_true", help="a local ipykernel (roundtrip)")
    p.add_argument("--code", default=PRINT, help="the cell run back to back (roundtrip)")
    a = p.parse_args()
    if a.part.startswith("_"):
        runs = {
            "_cold": lambda: _cold(a.image, a.per_round),
            "_start": lambda: _start(a.image, a.n, a.c),
            "_calls": lambda: _calls(a.image, a.n, a.seconds),
            "_paced": lambda: _paced(a.image, a.n, a.gap),
            "_roundtrip": lambda: _roundtrip(a.image, a.n, a.local, a.code),
        }
        print(json.dumps(asyncio.run(runs[a.part]())))
        return
    trees = {"old": a.old, "new": a.new}
    order = ["old", "new", "new", "old"] * a.rounds
    results: dict[str, list[Any]] = {"old": [], "new": []}
    docker: list[float] = []
    print(f"load at the start {os.getloadavg()[0]:.1f}; old {a.old}, new {a.new}")
    for name in order[: 2 * a.rounds]:
        if a.part == "cold":
            per_round = ["--per-round", str(a.per_round)]
            results[name] += _child(trees[name], "_cold", "--image", a.image, *per_round)
            docker += [_docker_true(a.image) for _ in range(a.per_round)]
        else:
            args = [
                "-n",
                str(a.n),
                "-c",
                str(a.c),
                "--seconds",
                str(a.seconds),
                "--gap",
                str(a.gap),
                *(["--local"] if a.local else []),
                *(["--code", a.code] if a.part == "roundtrip" else []),
            ]
            row = _child(trees[name], f"_{a.part}", "--image", a.image, *args)
            results[name].append(row)
            print(name, {k: round(v, 3) for k, v in row.items()}, flush=True)
    for name, rows in results.items():
        if a.part == "cold":
            total = statistics.median(r[0] for r in rows)
            ratio = total / statistics.median(docker)
            cpu = statistics.median(r[1] for r in rows)
            print(
                f"{name}: create -> first result p50 {total * 1000:.0f} ms = {ratio:.2f}x "
                f"docker run true; kernel CPU p50 {cpu * 1000:.0f} ms (n={len(rows)})"
            )
        else:
            med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
            print(f"{name} medians: {med}")
    if docker:
        print(f"docker run --rm IMAGE true p50 {statistics.median(docker) * 1000:.0f} ms")
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
