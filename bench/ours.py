"""What kernel_sandbox itself costs: cold start (with a breakdown), warm pool, round trips,
big outputs, throughput, density.  Timestamps are taken here, never in the library.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import time
from pathlib import Path
from typing import Any

import docker

from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.pool import SandboxPool
from kernel_sandbox.sandbox import AsyncSandbox

BENCH_LABEL = {"kernel-sandbox.bench": "1"}
PLOT = (
    "import matplotlib.pyplot as plt\n"
    "plt.figure(figsize=(4, 3)); plt.plot(range(50), [i * i for i in range(50)]); plt.show()"
)
#: A describe() and a PNG in one cell: the same cell bench/peers/driver.py sends.
ANALYSIS = (
    "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.DataFrame(np.random.default_rng(0).normal(size=(1000, 4)), columns=list('abcd'))\n"
    "plt.figure(figsize=(4, 3)); plt.plot(df['a'].cumsum()); plt.show()\n"
    "df.describe()"
)
#: When did the kernel process start (host clock; containers share the host kernel)?
KERNEL_STARTED = (
    "import os, time\n"
    "ticks = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
    "age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf('SC_CLK_TCK')\n"
    "print(time.time() - age)"
)


class TimedEngine:
    """Its own docker client whose create/start calls are time-stamped; ``host`` makes
    DockerHosts on it (``AsyncSandbox.create(host=engine.host)``)."""

    def __init__(self) -> None:
        self.client = docker.from_env(timeout=120)
        self.host = functools.partial(DockerHost, client=self.client)
        self.marks: dict[str, float] = {}
        api = self.client.api
        create, start = api.create_container, api.start

        def timed_create(*args: Any, **kwargs: Any) -> Any:
            self.marks["create_called"] = time.time()
            result = create(*args, **kwargs)
            self.marks["created"] = time.time()
            return result

        def timed_start(*args: Any, **kwargs: Any) -> Any:
            result = start(*args, **kwargs)
            self.marks["started"] = time.time()
            return result

        api.create_container = timed_create  # type: ignore[method-assign]
        api.start = timed_start  # type: ignore[method-assign]


def config(image: str) -> SandboxConfig:
    return SandboxConfig(image=image, labels=dict(BENCH_LABEL))


async def cold_start(image: str, n: int) -> dict[str, list[float]]:
    """create → first result of print(1+1), n times in a row, with where the time went."""
    engine = TimedEngine()
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "total",
            "engine_create",
            "engine_start",
            "start_to_kernel_exec",
            "kernel_exec_to_ready",
            "first_call",
            "close",
        )
    }
    for _ in range(n):
        engine.marks.clear()
        t0 = time.time()
        sandbox = await AsyncSandbox.create(config(image), host=engine.host)
        ready = time.time()
        first = await sandbox.run_python("print(1+1)")
        done = time.time()
        assert first.text == "2", first.text
        kernel_exec = float((await sandbox.run_python(KERNEL_STARTED)).text)
        t_close = time.time()
        await sandbox.close()
        m = engine.marks
        out["total"].append(done - t0)
        out["engine_create"].append(m["created"] - m["create_called"])
        out["engine_start"].append(m["started"] - m["created"])
        out["start_to_kernel_exec"].append(kernel_exec - m["created"])
        out["kernel_exec_to_ready"].append(ready - kernel_exec)
        out["first_call"].append(done - ready)
        out["close"].append(time.time() - t_close)
    return out


async def parallel_start(image: str, k: int) -> float:
    """Seconds until k sandboxes started at the same moment all answered print(1+1)."""
    t0 = time.perf_counter()
    sandboxes = await asyncio.gather(*(AsyncSandbox.create(config(image)) for _ in range(k)))
    try:
        await asyncio.gather(*(s.run_python("print(1+1)") for s in sandboxes))
        return time.perf_counter() - t0
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def warm_pool(image: str, n: int, size: int) -> dict[str, list[float]]:
    """acquire() of a ready member, and acquire → first result, n times."""
    acquire: list[float] = []
    first: list[float] = []
    async with SandboxPool(config(image), size=size) as pool:
        for _ in range(n):
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # steady state: the last one was replaced
                s = pool.stats()
                if s.idle >= size and not s.creating and not s.closing:
                    break
                await asyncio.sleep(0.02)
            t0 = time.perf_counter()
            sandbox = await pool.acquire()
            t1 = time.perf_counter()
            result = await sandbox.run_python("print(1+1)")
            t2 = time.perf_counter()
            assert result.text == "2", result.text
            await pool.release(sandbox)
            acquire.append(t1 - t0)
            first.append(t2 - t0)
    return {"acquire": acquire, "acquire_to_first_result": first}


async def round_trips(image: str, calls: int, big: int) -> dict[str, Any]:
    """print(1+1) round trips; 1 MB of stdout; a matplotlib PNG and a describe() + PNG
    cell (first ones apart, they import); state kept between calls."""
    async with await AsyncSandbox.create(config(image)) as sandbox:
        for _ in range(20):
            await sandbox.run_python("print(1+1)")
        latency = []
        for _ in range(calls):
            t = time.perf_counter()
            await sandbox.run_python("print(1+1)")
            latency.append(time.perf_counter() - t)
        stdout_1mb = []
        for _ in range(big):
            t = time.perf_counter()
            ex = await sandbox.run_python("print('x' * 1_000_000)")
            stdout_1mb.append(time.perf_counter() - t)
            assert len(ex.stdout) == 1_000_001, len(ex.stdout)
        t = time.perf_counter()
        ex = await sandbox.run_python(PLOT)
        png_first = [time.perf_counter() - t]
        png = []
        for _ in range(big):
            t = time.perf_counter()
            ex = await sandbox.run_python(PLOT)
            png.append(time.perf_counter() - t)
            assert ex.images("image/png"), ex.text
        t = time.perf_counter()
        await sandbox.run_python(ANALYSIS)
        analysis_first = [time.perf_counter() - t]
        analysis = []
        for _ in range(5):
            t = time.perf_counter()
            ex = await sandbox.run_python(ANALYSIS)
            analysis.append(time.perf_counter() - t)
            assert ex.images("image/png") and "mean" in ex.text, ex.text
        await sandbox.run_python("x = 41")
        state_kept = (await sandbox.run_python("print(x + 1)")).text == "42"
    return {
        "print": latency,
        "stdout_1mb": stdout_1mb,
        "png_first_with_import": png_first,
        "png": png,
        "analysis_first_with_import": analysis_first,
        "analysis": analysis,
        "state_kept": state_kept,
    }


async def throughput(image: str, counts: list[int], seconds: float) -> dict[str, float]:
    """Short executions per second over k sandboxes driven at once (one caller each)."""
    sandboxes = await _start_many(image, max(counts), concurrency=4)
    try:
        for s in sandboxes:
            await s.run_python("x = 0")
        rates: dict[str, float] = {}
        for k in counts:
            done = 0
            stop = time.perf_counter() + seconds

            async def drive(sandbox: AsyncSandbox, stop: float = stop) -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    await sandbox.run_python("x += 1")
                    done += 1

            t0 = time.perf_counter()
            await asyncio.gather(*(drive(s) for s in sandboxes[:k]))
            rates[str(k)] = done / (time.perf_counter() - t0)
        return rates
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def _start_many(
    image: str, n: int, concurrency: int, mem_floor: int = 0
) -> list[AsyncSandbox]:
    """Start n sandboxes, ``concurrency`` at a time; none once the host's available
    memory is under ``mem_floor`` bytes (the density run stops there instead of pushing
    the machine, which others share, into the OOM killer)."""
    slots = asyncio.Semaphore(concurrency)

    async def one() -> AsyncSandbox | None:
        async with slots:
            if mem_floor and _mem_available() < mem_floor:
                return None
            return await AsyncSandbox.create(config(image))

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    sandboxes = [r for r in results if isinstance(r, AsyncSandbox)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(s.close() for s in sandboxes))
        raise errors[0]
    return sandboxes


async def density(
    image: str, n: int, concurrency: int, mem_floor_gb: float = 3.0
) -> dict[str, Any]:
    """Start n sandboxes, check all answer at once, and measure what an idle one costs:
    in its cgroup, and on the engine's side (each container's shim, and the growth of
    dockerd and containerd), and on the host as a whole (MemAvailable)."""
    _raise_open_file_limit()
    before = _mem_available()
    engine_before = _engine_rss()
    own_before = _pss(os.getpid())
    t0 = time.perf_counter()
    sandboxes = await _start_many(image, n, concurrency, int(mem_floor_gb * 2**30))
    started = time.perf_counter() - t0
    try:
        answers = await asyncio.gather(*(s.run_python("print(1+1)") for s in sandboxes))
        alive = sum(a.text == "2" for a in answers)
        await asyncio.sleep(2)  # let start-up garbage settle before measuring idle memory
        api = docker.from_env(timeout=120).api
        usages, rss, procs, threads = [], [], [], []
        for s in sandboxes:
            stats = await asyncio.to_thread(api.stats, s.container_id, stream=False, one_shot=True)
            mem = stats["memory_stats"]
            detail = mem.get("stats", {})
            usages.append(mem["usage"] - detail.get("total_inactive_file", detail.get("cache", 0)))
            rss.append(detail.get("total_rss", detail.get("anon", 0)))
            top = await asyncio.to_thread(api.top, s.container_id)
            pids = [row[top["Titles"].index("PID")] for row in top["Processes"]]
            procs.append(len(pids))
            threads.append(sum(_threads(int(p)) for p in pids))
        shims = _shim_pss({s.container_id for s in sandboxes})
        engine_after = _engine_rss()
        after = _mem_available()
        k = max(len(sandboxes), 1)
        return {
            "requested": n,
            "started": len(sandboxes),
            "alive": alive,
            "seconds_to_start_all": started,
            "start_concurrency": concurrency,
            "mem_floor_gb": mem_floor_gb,
            "cgroup_mem_per_sandbox_mb": [u / 2**20 for u in usages],
            "rss_per_sandbox_mb": [r / 2**20 for r in rss],
            "shim_pss_per_sandbox_mb": [x / 2**20 for x in shims],
            "engine_growth_per_sandbox_mb": (engine_after - engine_before) / k / 2**20,
            "client_pss_per_sandbox_mb": (_pss(os.getpid()) - own_before) / k / 2**20,
            "host_mem_per_sandbox_mb": (before - after) / k / 2**20,
            "processes_per_sandbox": procs,
            "threads_per_sandbox": threads,
            "open_files_of_this_process": len(os.listdir("/proc/self/fd")),
        }
    finally:
        slots = asyncio.Semaphore(concurrency)  # hundreds of removals at once swamp the engine

        async def close(sandbox: AsyncSandbox) -> None:
            async with slots:
                await sandbox.close()

        await asyncio.gather(*(close(s) for s in sandboxes))


def _raise_open_file_limit() -> None:
    """Each sandbox holds a few dozen descriptors in this process: use the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _pss(pid: int) -> int:
    """Proportional set size of a process in bytes (shared pages split among users)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _shim_pss(container_ids: set[str]) -> list[int]:
    """PSS of the ``containerd-shim`` of each of these containers (the engine's per-
    container process; runc is gone once a container runs)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and b"-id" in argv:
            cid = argv[argv.index(b"-id") + 1].decode()
            if cid in container_ids:
                out.append(_pss(int(pid)))
    return out


def _engine_rss() -> int:
    """RSS of the engine's daemons (dockerd and its containerd), from their pid files."""
    total = 0
    for pid_file in ("/var/run/docker.pid", "/var/run/docker/containerd/containerd.pid"):
        try:
            pid = int(Path(pid_file).read_text().strip())
            with open(f"/proc/{pid}/status") as f:
                total += next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))
        except (OSError, ValueError, StopIteration):
            continue
    return total


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0
