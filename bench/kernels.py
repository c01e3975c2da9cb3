"""Every kernel, sandboxed beside the same kernel run plainly: start, round trip, memory.

    PYTHONPATH=$PWD python bench/kernels.py                  # 5 starts, 50 calls each
    PYTHONPATH=$PWD python bench/kernels.py --starts 3 --calls 200 --languages r bash

Per language (python: ipykernel; r: IRkernel; javascript: Deno; bash: bash_kernel), all
from ``kernel-sandbox:polyglot`` so both sides run the same binaries:

- **sandboxed**: ``AsyncSandbox.create(image, kernel=...)`` then ``run_code('1+1')``
  (bash: ``echo $((1+1))``) to its result — *create → first result* — then ``--calls``
  more ``1+1`` round trips from this process, and the sandbox's memory once idle (its
  cgroup's usage less inactive page cache, 2 s after the last call, as bench/ours.py's
  density part reads it).
- **plain**: the same kernelspec started by ``jupyter_client`` inside a plain container
  of the same image (``docker run --network none``, nothing of kernel_sandbox in it):
  kernel start → first result and the round trips, both timed inside the container
  (no host-to-container hop, no relay, no supervisor, no output caps; a bare zmq
  client), and that container's memory with one idle kernel in it (the driver's own
  RSS left out).  Its *create* excludes the
  container's own start: ``docker run --rm IMAGE true`` is measured in the same run
  and printed beside it.

Times are medians (p50) in the same run; nothing is asserted.  The machine's load is
printed with the table: on a loaded machine every figure grows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import docker

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402

from kernel_sandbox.sandbox import AsyncSandbox  # noqa: E402

IMAGE = "kernel-sandbox:polyglot"
LABELS = {"kernel-sandbox.bench": "1"}
#: language -> (kernelspec, the 1+1 cell, its text result)
LANGUAGES = {
    "python": ("python3", "1+1", "2"),
    "r": ("ir", "1+1", "[1] 2"),
    "javascript": ("deno", "1+1", "2"),
    "bash": ("bash", "echo $((1+1))", "2"),
}
#: Runs in the plain container with the image's Python: start the kernelspec with
#: jupyter_client ``starts`` times (start -> first result), ``calls`` round trips on the
#: last one (plain zmq and jupyter_client's Session: no client overhead to speak of),
#: which is left running, idle; prints JSON (with its own RSS, which the memory figure
#: leaves out) and waits for stdin to close (an ipykernel ends with its parent).
PLAIN_DRIVER = textwrap.dedent(
    """
    import json, sys, time
    import zmq
    from jupyter_client.manager import KernelManager
    name, starts, calls, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    context = zmq.Context()

    def connect(km):
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)  # jupyter_client's own nudge until iopub carries
        kc.stop_channels()
        info = km.get_connection_info()
        shell, iopub = context.socket(zmq.DEALER), context.socket(zmq.SUB)
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        shell.connect(f"tcp://127.0.0.1:{info['shell_port']}")
        iopub.connect(f"tcp://127.0.0.1:{info['iopub_port']}")
        time.sleep(0.5)  # the subscription reaches the kernel's PUB
        return shell, iopub

    def run(km, shell, iopub):
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        msg_id = km.session.send(shell, "execute_request", content)["header"]["msg_id"]
        poller = zmq.Poller()
        poller.register(shell, zmq.POLLIN)
        poller.register(iopub, zmq.POLLIN)
        status = idle = None
        while status is None or not idle:
            for sock, _ in poller.poll(120_000):
                _, msg = km.session.feed_identities(sock.recv_multipart())
                msg = km.session.deserialize(msg)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if sock is shell:
                    status = msg["content"]["status"]
                elif msg["msg_type"] == "status":
                    idle = msg["content"]["execution_state"] == "idle"
        assert status == "ok", status

    first, trips = [], []
    for i in range(starts):
        t0 = time.perf_counter()
        km = KernelManager(kernel_name=name)
        km.start_kernel()
        shell, iopub = connect(km)
        run(km, shell, iopub)
        first.append(time.perf_counter() - t0 - 0.5)  # less the subscription's wait
        if i < starts - 1:
            shell.close(linger=0)
            iopub.close(linger=0)
            km.shutdown_kernel(now=True)
    for _ in range(calls):
        t0 = time.perf_counter()
        run(km, shell, iopub)
        trips.append(time.perf_counter() - t0)
    rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
    print(json.dumps({"first": first, "trips": trips, "driver_kb": rss}), flush=True)
    sys.stdin.read()
    km.shutdown_kernel(now=True)
    """
)


def _idle_memory(client: docker.DockerClient, container_id: str) -> float:
    """MB the container's cgroup uses, less inactive page cache (bench/ours.py's figure)."""
    stats = client.api.stats(container_id, stream=False, one_shot=True)
    mem = stats["memory_stats"]
    detail = mem.get("stats", {})
    used = mem["usage"] - detail.get("total_inactive_file", detail.get("inactive_file", 0))
    return float(used / 2**20)


async def sandboxed(language: str, starts: int, calls: int) -> dict[str, Any]:
    """create -> first result ``starts`` times, then round trips and idle memory."""
    kernel, code, expected = LANGUAGES[language]
    client = docker.from_env(timeout=120)
    first: list[float] = []
    for i in range(starts):
        t0 = time.perf_counter()
        sb = await AsyncSandbox.create(image=IMAGE, kernel=kernel, labels=LABELS, timeout=120)
        ex = await sb.run_code(code)
        first.append(time.perf_counter() - t0)
        assert ex.status == "ok" and ex.text.strip() == expected, (language, ex.status, ex.text)
        if i < starts - 1:
            await sb.close()
    try:
        trips = []
        for _ in range(calls):
            t0 = time.perf_counter()
            ex = await sb.run_code(code)
            trips.append(time.perf_counter() - t0)
            assert ex.status == "ok", ex.text
        await asyncio.sleep(2)
        assert sb.container_id is not None
        memory = await asyncio.to_thread(_idle_memory, client, sb.container_id)
    finally:
        await sb.close()
    return {"first": first, "trips": trips, "idle_mb": memory}


def plain(language: str, starts: int, calls: int) -> dict[str, Any]:
    """The same kernelspec by jupyter_client in a plain container of the same image."""
    kernel, code, _ = LANGUAGES[language]
    client = docker.from_env(timeout=120)
    container = client.containers.run(
        IMAGE,
        ["sleep", "infinity"],
        entrypoint=[],
        detach=True,
        network_mode="none",
        labels=LABELS,
        init=True,
    )
    try:
        argv = ["/opt/venv/bin/python", "-c", PLAIN_DRIVER, kernel, str(starts), str(calls), code]
        driver = subprocess.Popen(
            ["docker", "exec", "-i", container.id, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert driver.stdout is not None and driver.stdin is not None
        line = driver.stdout.readline()
        if not line:
            error = driver.communicate()[1][-1000:]
            raise RuntimeError(f"{language} in a plain container: {error}")
        result: dict[str, Any] = json.loads(line)
        time.sleep(2)  # idle, as the sandbox before its figure
        used = _idle_memory(client, str(container.id))
        result["idle_mb"] = used - result["driver_kb"] / 1024  # the kernel, not its client
        driver.stdin.close()
        driver.wait(timeout=60)
        return result
    finally:
        container.remove(force=True)


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def table(results: dict[str, Any], container_start: list[float]) -> str:
    head = (
        "| language | create → first result, sandboxed | kernel start → first result, plain "
        "| `1+1` p50 sandboxed | `1+1` p50 plain | idle MB sandboxed | idle MB plain |"
    )
    lines = [head, "|" + "---|" * 7]
    for language, r in results.items():
        ours, theirs = r["sandboxed"], r["plain"]
        lines.append(
            f"| {language} ({LANGUAGES[language][0]}) "
            f"| {p50_ms(ours['first']):.0f} ms | {p50_ms(theirs['first']):.0f} ms "
            f"| {p50_ms(ours['trips']):.1f} ms | {p50_ms(theirs['trips']):.1f} ms "
            f"| {ours['idle_mb']:.0f} | {theirs['idle_mb']:.0f} |"
        )
    lines.append("")
    lines.append(
        f"A plain container's own start (`docker run --rm --network none {IMAGE} true`, "
        f"p50 of {len(container_start)}): {p50_ms(container_start):.0f} ms; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores."
    )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="creates per language and side")
    parser.add_argument("--calls", type=int, default=50, help="1+1 round trips per side")
    parser.add_argument("--languages", nargs="+", default=list(LANGUAGES), choices=LANGUAGES)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for language in args.languages:  # the two sides in turn, one language at a time
        print(f"{language}: sandboxed ...", file=sys.stderr, flush=True)
        ours = await sandboxed(language, args.starts, args.calls)
        print(f"{language}: plain container ...", file=sys.stderr, flush=True)
        theirs = await asyncio.to_thread(plain, language, args.starts, args.calls)
        results[language] = {"sandboxed": ours, "plain": theirs}
    container_start = baselines.docker_run_true(IMAGE, args.starts)
    print(table(results, container_start))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "docker_run_true": container_start}))


if __name__ == "__main__":
    asyncio.run(main())
