"""Baselines measured in the same run: bare ``docker run``, a local ipykernel, ms-enclave.

- ``docker run --rm --network none IMAGE true``: what the engine costs for any
  container of the same image (the CLI's own start-up included, as a user sees it).
- A local ipykernel without a container, driven by jupyter_client over ipc: the floor
  for a round trip.  Measured twice: stock, and with the flags our launcher uses, so
  that kernel tuning and container overhead can be told apart.
- ms-enclave 0.0.8's Docker sandbox ``python_executor``, from a bench-only virtualenv
  (never a dependency of kernel_sandbox) on a local ``python:3.11-slim`` stand-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MSENCLAVE_SPEC = "ms-enclave[docker]==0.0.8"
MSENCLAVE_VENV = Path(
    os.environ.get(
        "KS_BENCH_MSENCLAVE_VENV",
        Path.home() / ".cache" / "kernel-sandbox-bench" / "venv-msenclave",
    )
)
STANDIN_IMAGE = "python:3.11-slim"
#: The flags kernel_sandbox's launcher gives ipykernel (kernel/connection.py).
TUNED_KERNEL_ARGS = ["--HistoryManager.enabled=False", "--IPythonKernel._execute_sleep=0"]


def docker_run_true(image: str, n: int) -> list[float]:
    """Seconds for ``docker run --rm --network none IMAGE true``, n times."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", image, "true"],
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - t0)
    return times


async def local_kernel(
    calls: int, starts: int, tuned: bool, our_client: bool = False
) -> dict[str, list[float]]:
    """Start times and print(1+1) round trips of ipykernel on this host (no container).

    ``our_client`` drives it with kernel_sandbox's KernelSession instead of plain
    jupyter_client calls: the same client and kernel flags as a sandbox, minus the
    container.
    """
    from jupyter_client.manager import AsyncKernelManager

    from kernel_sandbox.kernel.client import KernelSession

    cold: list[float] = []
    latency: list[float] = []
    for i in range(starts):
        run_dir = tempfile.mkdtemp(prefix="ks-bench-local-")
        km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{run_dir}/k")
        t0 = time.perf_counter()
        await km.start_kernel(extra_arguments=TUNED_KERNEL_ARGS if tuned else [])
        if our_client:
            session = KernelSession(km.get_connection_info())  # type: ignore[arg-type]
            await session.connect(60, _alive)

            async def call(code: str, session: KernelSession = session) -> None:
                await session.execute(code, timeout=30, interrupt_grace=2, check_alive=_alive)

            stop = session.close
        else:
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)

            async def call(code: str, kc: Any = kc) -> None:
                await _round_trip(kc, code)

            stop = kc.stop_channels
        try:
            await call("print(1+1)")
            cold.append(time.perf_counter() - t0)
            if i == starts - 1:
                for _ in range(20):
                    await call("print(1+1)")
                for _ in range(calls):
                    t = time.perf_counter()
                    await call("print(1+1)")
                    latency.append(time.perf_counter() - t)
        finally:
            stop()
            await km.shutdown_kernel(now=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    return {"cold": cold, "latency": latency}


async def _alive() -> None:
    return None


async def _round_trip(kc: Any, code: str) -> None:
    """What a jupyter_client user does: execute, read iopub until idle, read the reply."""
    msg_id = kc.execute(code, store_history=True, allow_stdin=False)
    while True:
        msg = await kc.get_iopub_msg(timeout=30)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            break
    while True:
        reply = await kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return


def ensure_standin_image() -> str:
    """``python:3.11-slim`` for ms-enclave: reuse it, else make it with the project's builder.

    ms-enclave starts the image's own CMD with a tty (it must stay up, e.g. ``python3``)
    and runs ``timeout … sh -c "python /tmp/script.py"`` with ``mkdir`` beside it: a
    plain Debian Python does; no ipykernel is needed.
    """
    probe = subprocess.run(["docker", "image", "inspect", STANDIN_IMAGE], capture_output=True)
    if probe.returncode == 0:
        return STANDIN_IMAGE
    from kernel_sandbox.backends.docker.images import make_standin_image

    asyncio.run(make_standin_image())
    return STANDIN_IMAGE


def ensure_msenclave_venv() -> Path:
    """The bench-only virtualenv with ms-enclave; made on first use (needs the index)."""
    python = MSENCLAVE_VENV / "bin" / "python"
    check = [str(python), "-c", "import ms_enclave, docker"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    MSENCLAVE_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(MSENCLAVE_VENV)], check=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", MSENCLAVE_SPEC],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip install {MSENCLAVE_SPEC} failed:\n{done.stderr[-2000:]}")
    return python


def msenclave(starts: int, calls: int) -> dict[str, Any]:
    """Cold start (start + first result) and print(1+1) round trips of ms-enclave."""
    python = ensure_msenclave_venv()
    image = ensure_standin_image()
    driver = Path(__file__).with_name("msenclave_driver.py")
    done = subprocess.run(
        [str(python), str(driver), image, str(starts), str(calls)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # not the repo: ms-enclave must not import our files
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["image"] = image
    result["version"] = MSENCLAVE_SPEC
    return result
