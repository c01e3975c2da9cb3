"""Drive a stateful peer the way its users do; run with the peer's own virtualenv.

Not part of kernel_sandbox: ``bench/peers/__init__.py`` runs this file with the Python of
a bench-only virtualenv (AutoGen's autogen-ext, or smolagents) and reads one JSON line
from stdout.  Both peers keep a Jupyter kernel alive in a container behind a Jupyter
Kernel Gateway (HTTP + websocket on a published TCP port):

- ``autogen``: ``DockerJupyterServer`` + ``DockerJupyterCodeExecutor`` (autogen-ext),
  ``execute_code_blocks([CodeBlock(...)], CancellationToken())`` as in its docstring;
- ``smolagents``: ``DockerExecutor`` (what ``CodeAgent(executor_type="docker")`` makes),
  called as the agent calls it, ``executor(code)``.

    python driver.py PEER IMAGE STARTS CALLS IDLE
    python driver.py rl PEER IMAGE N M CONCURRENCY      # bench/rl.py's workload
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import json
import logging
import os
import socket
import sys
import time
import uuid
from typing import Any

LABEL = {"kernel-sandbox.bench": "1"}
NAME_PREFIX = "ks-bench-peer-"
#: The same cells bench/ours.py sends to our sandboxes.
PRINT = "print(1+1)"
ANALYSIS = (
    "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.DataFrame(np.random.default_rng(0).normal(size=(1000, 4)), columns=list('abcd'))\n"
    "plt.figure(figsize=(4, 3)); plt.plot(df['a'].cumsum()); plt.show()\n"
    "df.describe()"
)

#: bench/rl.py's cells, sent in turn to every sandbox: (kind, code).  Its callers get
#: ``(text, ename)`` back from each and ``rl_check`` judges it.
RL_SETUP = "import numpy as np"
RL_CELLS = (
    ("arithmetic", "sum(i * i for i in range(100))"),
    ("numpy", "int(np.arange(100).dot(np.arange(100)))"),
    ("table", "for i in range(8):\n    print(f'{i:3d} {i * i:5d} {i ** 0.5:7.3f}')"),
    ("failing", "1 / 0"),
)
_TABLE = "\n".join(f"{i:3d} {i * i:5d} {i**0.5:7.3f}" for i in range(8))


def rl_check(kind: str, got: tuple[str, str | None]) -> str | None:
    """What is wrong with one answer of an RL cell (None: right)."""
    text, ename = got
    if kind == "failing":
        return None if ename == "ZeroDivisionError" else f"{kind}: no ZeroDivisionError: {got}"
    if ename is not None:
        return f"{kind}: raised {ename}"
    want = _TABLE if kind == "table" else "328350"
    return None if text.strip("\n") == want else f"{kind}: {text[:80]!r}"


def cgroup_cpu(container_id: str) -> float:
    """CPU seconds a container has used so far, from its cgroup (v1 or v2)."""
    for pattern, scale in (
        (f"/sys/fs/cgroup/cpuacct/**/*{container_id}*/cpuacct.usage", 1e-9),
        (f"/sys/fs/cgroup/cpu,cpuacct/**/*{container_id}*/cpuacct.usage", 1e-9),
        (f"/sys/fs/cgroup/**/*{container_id}*/cpu.stat", 1e-6),
    ):
        for path in glob.glob(pattern, recursive=True):
            with open(path) as f:
                text = f.read()
            if path.endswith("cpu.stat"):
                fields = dict(line.split() for line in text.splitlines())
                return int(fields["usage_usec"]) * scale
            return int(text) * scale
    raise FileNotFoundError(f"no cgroup CPU figure for container {container_id}")


class AutoGenPeer:
    """One AutoGen sandbox: a kernel gateway container and an executor on it."""

    def __init__(self, image: str) -> None:
        self.image = image

    async def start(self) -> None:
        import tempfile

        from autogen_ext.code_executors.docker_jupyter import (
            DockerJupyterCodeExecutor,
            DockerJupyterServer,
        )

        # DockerJupyterServer's constructor is blocking (docker SDK); that is its API.  It
        # runs in a thread, so that several can start at once (bench/rl.py).
        self.server = await asyncio.to_thread(
            DockerJupyterServer,
            custom_image_name=self.image,
            container_name=NAME_PREFIX + uuid.uuid4().hex[:12],
        )
        self.out_dir = tempfile.mkdtemp(prefix="ks-bench-autogen-")
        from pathlib import Path

        # The executor lists kernel specs as soon as the container runs; requests' five
        # retries (~3 s) do not cover a gateway start on a loaded machine, so wait for
        # the gateway to answer first, as a user must (the wait counts in the figures).
        url = f"http://127.0.0.1:{self.server._port}/api/kernelspecs"
        await _wait_http(url, self.server._token)

        self.executor = DockerJupyterCodeExecutor(
            jupyter_server=self.server, output_dir=Path(self.out_dir)
        )
        await self.executor.__aenter__()

    @property
    def container_id(self) -> str:
        return str(self.server._container_id)

    async def run_any(self, code: str) -> Any:
        from autogen_core import CancellationToken
        from autogen_core.code_executor import CodeBlock

        return await self.executor.execute_code_blocks(
            [CodeBlock(code=code, language="python")], CancellationToken()
        )

    async def rl_call(self, code: str) -> tuple[str, str | None]:
        """(text, ename) as bench/rl.py wants it; AutoGen gives the traceback as text."""
        result = await self.run_any(code)
        if result.exit_code == 0:
            return result.output.strip("\n"), None
        return "", "ZeroDivisionError" if "ZeroDivisionError" in result.output else "error"

    async def run(self, code: str) -> tuple[str, bool]:
        result = await self.run_any(code)
        if result.exit_code != 0:
            raise RuntimeError(result.output)
        pngs = [p for p in result.output_files if str(p).endswith(".png")]
        return result.output.strip(), bool(pngs)

    async def stop(self) -> None:
        import shutil

        await self.executor.__aexit__(None, None, None)
        await self.server.stop()
        shutil.rmtree(self.out_dir, ignore_errors=True)


class SmolagentsPeer:
    """One smolagents sandbox: ``DockerExecutor`` on its own host port."""

    def __init__(self, image: str) -> None:
        self.image = image

    async def start(self) -> None:
        from smolagents.monitoring import AgentLogger, LogLevel
        from smolagents.remote_executors import DockerExecutor

        self.executor = DockerExecutor(
            additional_imports=[],
            logger=AgentLogger(level=LogLevel.OFF),
            port=_free_port(),
            image_name=self.image,
            build_new_image=False,
            container_run_kwargs={"labels": LABEL, "name": NAME_PREFIX + uuid.uuid4().hex[:12]},
        )

    @property
    def container_id(self) -> str:
        return str(self.executor.container.id)

    async def run(self, code: str) -> tuple[str, bool]:
        out = self.executor(code)
        text = (out.logs or "") + ("" if out.output is None else str(out.output))
        # The executor keeps stream text and the last expression's text/plain; a
        # display_data (a matplotlib PNG) is dropped, so it can never report one.
        return text.strip(), False

    async def rl_call(self, code: str) -> tuple[str, str | None]:
        """(text, ename); the executor is blocking, so each call runs in a thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_THREADS, self._rl_call, code)

    def _rl_call(self, code: str) -> tuple[str, str | None]:
        try:
            out = self.executor(code)
        except Exception as exc:  # smolagents raises the cell's error as AgentError
            return "", "ZeroDivisionError" if "ZeroDivisionError" in str(exc) else "error"
        text = (out.logs or "") + ("" if out.output is None else str(out.output))
        return text.strip("\n"), None

    async def stop(self) -> None:
        self.executor.cleanup()


#: Threads for the blocking smolagents calls: one per sandbox driven at once.
_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=64)


PEERS = {"autogen": AutoGenPeer, "smolagents": SmolagentsPeer}


async def _wait_http(url: str, token: str, timeout: float = 120) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    while True:
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def idle_memory(container_ids: list[str]) -> list[float]:
    """MB per container as bench/ours.py counts it: cgroup usage less inactive file cache."""
    import docker

    api = docker.from_env(timeout=120).api
    out = []
    for cid in container_ids:
        mem = api.stats(cid, stream=False, one_shot=True)["memory_stats"]
        detail = mem.get("stats", {})
        out.append(
            (mem["usage"] - detail.get("total_inactive_file", detail.get("cache", 0))) / 2**20
        )
    return out


async def main(peer_name: str, image: str, starts: int, calls: int, idle: int) -> dict[str, Any]:
    make = PEERS[peer_name]
    r: dict[str, Any] = {"cold": [], "latency": [], "analysis": [], "errors": []}
    for i in range(starts):
        peer = make(image)
        t0 = time.perf_counter()
        await peer.start()
        try:
            text, _ = await peer.run(PRINT)
            r["cold"].append(time.perf_counter() - t0)
            assert text == "2", text
            if i < starts - 1:
                continue
            for _ in range(20):
                await peer.run(PRINT)
            for _ in range(calls):
                t = time.perf_counter()
                await peer.run(PRINT)
                r["latency"].append(time.perf_counter() - t)
            await peer.run("x = 41")
            text, _ = await peer.run("print(x + 1)")
            r["state_kept"] = text == "42"
            t = time.perf_counter()
            text, png = await peer.run(ANALYSIS)
            r["analysis_first_with_import"] = time.perf_counter() - t
            for _ in range(5):
                t = time.perf_counter()
                text, png = await peer.run(ANALYSIS)
                r["analysis"].append(time.perf_counter() - t)
            r["analysis_png_returned"] = png
            r["analysis_describe_returned"] = "mean" in text or ".html" in text
        finally:
            await peer.stop()
    peers = []
    try:
        for _ in range(idle):
            peer = make(image)
            await peer.start()
            peers.append(peer)
            await peer.run(PRINT)
        await asyncio.sleep(2)  # as bench/ours.py: let start-up garbage settle
        r["idle_mem_mb"] = idle_memory([p.container_id for p in peers])
    except Exception as exc:  # reported; the figures above stand
        r["errors"].append(f"idle: {type(exc).__name__}: {exc}")
    finally:
        for p in peers:
            await p.stop()
    return r


async def rl(peer_name: str, image: str, n: int, m: int, concurrency: int) -> dict[str, Any]:
    """bench/rl.py's workload on n sandboxes of a peer: the figures it reports."""
    make = PEERS[peer_name]
    # smolagents' executor gives its gateway a short wait: 4 starting at once on two busy
    # cores failed three times in a row, so it starts one at a time (as the table says).
    concurrency = 1 if peer_name == "smolagents" else concurrency
    slots = asyncio.Semaphore(concurrency)

    start_failures: list[str] = []

    async def start() -> Any:
        # A peer whose start fails on a loaded machine (smolagents: the gateway drops
        # its first connection) is started again, as its user would; the failures count.
        async with slots:
            for attempt in range(3):
                peer = make(image)
                try:
                    if peer_name == "smolagents":  # its constructor blocks until it runs
                        loop = asyncio.get_running_loop()
                        await loop.run_in_executor(_THREADS, _start_sync, peer)
                    else:
                        await peer.start()
                    return peer
                except Exception as exc:
                    start_failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    t0 = time.perf_counter()
    made = await asyncio.gather(*(start() for _ in range(n)), return_exceptions=True)
    started = time.perf_counter() - t0
    running = [p for p in made if not isinstance(p, BaseException)]
    try:
        failed = [p for p in made if isinstance(p, BaseException)]
        if failed:
            raise failed[0]
        ids = [p.container_id for p in running]
        for p in running:
            await p.rl_call(RL_SETUP)
        latencies: list[float] = []
        wrong: list[str] = []

        async def drive(p: Any) -> None:
            for i in range(m):
                kind, code = RL_CELLS[i % len(RL_CELLS)]
                t = time.perf_counter()
                got = await p.rl_call(code)
                latencies.append(time.perf_counter() - t)
                problem = rl_check(kind, got)
                if problem and len(wrong) < 20:
                    wrong.append(problem)

        kernel0 = sum(map(cgroup_cpu, ids))
        own0 = os.times()
        t0 = time.perf_counter()
        await asyncio.gather(*(drive(p) for p in running))
        wall = time.perf_counter() - t0
        own = os.times()
        kernel = sum(map(cgroup_cpu, ids)) - kernel0
    finally:
        await asyncio.gather(*(p.stop() for p in running), return_exceptions=True)
    return {
        "executions": len(latencies),
        "seconds": wall,
        "per_second": len(latencies) / wall,
        "kernel_cpu_s": kernel,
        # the driver's CPU, its threads included (as time.process_time() counts ours)
        "host_cpu_s": own.user + own.system - own0.user - own0.system,
        "latency": latencies,
        "wrong": wrong,
        "started_per_second": n / started,
        "start_seconds": started,
        "start_failures": start_failures,
        "start_concurrency": concurrency,
    }


def _start_sync(peer: Any) -> None:
    asyncio.run(peer.start())


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    if sys.argv[1] == "rl":
        peer_name, image = sys.argv[2], sys.argv[3]
        n, m, concurrency = (int(x) for x in sys.argv[4:7])
        print(json.dumps(asyncio.run(rl(peer_name, image, n, m, concurrency))))
        sys.exit(0)
    peer_name, image = sys.argv[1], sys.argv[2]
    starts, calls, idle = (int(x) for x in sys.argv[3:6])
    print(json.dumps(asyncio.run(main(peer_name, image, starts, calls, idle))))
