"""runc beside gVisor's runsc in the same run: cold start, round trip, idle memory.

What the second wall costs.  The two runtimes take turns (one cold start of each, then
the next; round trips in alternating batches on two open sandboxes) so a change in the
machine's load falls on both.  Idle memory is the container cgroup's usage without page
cache, as ``docker stats`` counts it; under runsc that cgroup also holds gVisor's own
kernel (the sentry and its gofer), which is the point.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import docker

from kernel_sandbox import AsyncSandbox, SandboxConfig

BENCH_LABEL = {"kernel-sandbox.bench": "gvisor"}
#: Round trips per batch before switching to the other runtime's sandbox.
_BATCH = 20


def _config(image: str, runtime: str) -> SandboxConfig:
    return SandboxConfig(image=image, runtime=runtime, labels=dict(BENCH_LABEL))


async def _cold(image: str, runtime: str) -> float:
    t0 = time.perf_counter()
    async with await AsyncSandbox.create(_config(image, runtime)) as sandbox:
        first = await sandbox.run_python("print(1+1)")
        took = time.perf_counter() - t0
        assert first.text == "2", first.text
    return took


async def _idle_mb(image: str, runtime: str, n: int) -> list[float]:
    sandboxes = [await AsyncSandbox.create(_config(image, runtime)) for _ in range(n)]
    try:
        for s in sandboxes:
            assert (await s.run_python("print(1+1)")).text == "2"
        await asyncio.sleep(3)  # let start-up garbage settle
        api = docker.from_env(timeout=120).api
        usages = []
        for s in sandboxes:
            stats = await asyncio.to_thread(api.stats, s.container_id, stream=False, one_shot=True)
            mem = stats["memory_stats"]
            detail = mem.get("stats", {})
            cache = detail.get("total_inactive_file", detail.get("cache", 0))
            usages.append((mem["usage"] - cache) / 2**20)
        return usages
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def compare(
    image: str, runtimes: tuple[str, ...], cold: int, calls: int, idle: int
) -> dict[str, Any]:
    """Per runtime: cold starts (s), print(1+1) round trips (s), idle memory (MB)."""
    out: dict[str, Any] = {rt: {"cold": [], "round_trip": [], "idle_mb": []} for rt in runtimes}
    for _ in range(cold):
        for rt in runtimes:
            out[rt]["cold"].append(await _cold(image, rt))
    opened = {rt: await AsyncSandbox.create(_config(image, rt)) for rt in runtimes}
    try:
        for sandbox in opened.values():
            for _ in range(_BATCH):
                await sandbox.run_python("print(1+1)")
        done = 0
        while done < calls:
            for rt, sandbox in opened.items():
                for _ in range(min(_BATCH, calls - done)):
                    t = time.perf_counter()
                    await sandbox.run_python("print(1+1)")
                    out[rt]["round_trip"].append(time.perf_counter() - t)
            done += _BATCH
    finally:
        await asyncio.gather(*(s.close() for s in opened.values()))
    for rt in runtimes:
        out[rt]["idle_mb"] = await _idle_mb(image, rt, idle)
    return out
