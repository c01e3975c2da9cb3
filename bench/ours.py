"""What kernel_sandbox itself costs: cold start (with a breakdown), warm pool, round trips,
big outputs, throughput, density.  Timestamps are taken here, never in the library.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
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


async def round_trips(image: str, calls: int, big: int) -> dict[str, list[float]]:
    """print(1+1) round trips; 1 MB of stdout; a matplotlib PNG (first one apart)."""
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
    return {
        "print": latency,
        "stdout_1mb": stdout_1mb,
        "png_first_with_import": png_first,
        "png": png,
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


async def _start_many(image: str, n: int, concurrency: int) -> list[AsyncSandbox]:
    slots = asyncio.Semaphore(concurrency)

    async def one() -> AsyncSandbox:
        async with slots:
            return await AsyncSandbox.create(config(image))

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    sandboxes = [r for r in results if isinstance(r, AsyncSandbox)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(s.close() for s in sandboxes))
        raise errors[0]
    return sandboxes


async def density(image: str, n: int, concurrency: int) -> dict[str, Any]:
    """Start n sandboxes, check all answer at once, and measure what an idle one costs."""
    before = _mem_available()
    t0 = time.perf_counter()
    sandboxes = await _start_many(image, n, concurrency)
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
        after = _mem_available()
        return {
            "requested": n,
            "alive": alive,
            "seconds_to_start_all": started,
            "start_concurrency": concurrency,
            "cgroup_mem_per_sandbox_mb": [u / 2**20 for u in usages],
            "rss_per_sandbox_mb": [r / 2**20 for r in rss],
            "host_mem_per_sandbox_mb": (before - after) / n / 2**20,
            "processes_per_sandbox": procs,
            "threads_per_sandbox": threads,
        }
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


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
