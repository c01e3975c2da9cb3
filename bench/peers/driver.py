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
"""

from __future__ import annotations

import asyncio
import json
import logging
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

        # DockerJupyterServer's constructor is blocking (docker SDK); that is its API.
        self.server = DockerJupyterServer(
            custom_image_name=self.image, container_name=NAME_PREFIX + uuid.uuid4().hex[:12]
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

    async def run(self, code: str) -> tuple[str, bool]:
        from autogen_core import CancellationToken
        from autogen_core.code_executor import CodeBlock

        result = await self.executor.execute_code_blocks(
            [CodeBlock(code=code, language="python")], CancellationToken()
        )
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

    async def stop(self) -> None:
        self.executor.cleanup()


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


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    peer_name, image = sys.argv[1], sys.argv[2]
    starts, calls, idle = (int(x) for x in sys.argv[3:6])
    print(json.dumps(asyncio.run(main(peer_name, image, starts, calls, idle))))
