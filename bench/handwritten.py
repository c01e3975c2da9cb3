"""What the hand-written hot paths save over the library calls they replace, same run.

    PYTHONPATH=$PWD python bench/handwritten.py --n 2000

- ``outputs``: ``kernel/outputs._output_from`` against ``nbformat.v4.output_from_msg``
  (which validates every output against the schema), per output, for a stream chunk,
  a PNG ``display_data`` and an ``execute_result``.  No kernel.
- ``receive``: a ``kernel_info_request`` round trip through ``KernelSession`` (its raw
  pyzmq channels read through the event loop) against jupyter_client's
  ``AsyncKernelClient`` (``kernel_info()`` then ``shell_channel.get_msg``), per message:
  one local ipykernel (no container) answers both clients, taking turns.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from nbformat.v4 import output_from_msg

from kernel_sandbox.kernel.client import KernelSession
from kernel_sandbox.kernel.outputs import _output_from

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(3000)).decode()
MESSAGES: dict[str, dict[str, Any]] = {
    "stream": {"name": "stdout", "text": "2\n"},
    "display_data": {"data": {"image/png": PNG, "text/plain": "<Figure>"}, "metadata": {}},
    "execute_result": {"data": {"text/plain": "2"}, "metadata": {}, "execution_count": 1},
}


def _us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 2)


def outputs(n: int) -> dict[str, dict[str, float]]:
    """Median microseconds per output: library and hand-written, per message type."""
    out = {}
    for msg_type, content in MESSAGES.items():
        msg = {"header": {"msg_type": msg_type}, "msg_type": msg_type, "content": content}
        lib, ours = [], []
        for _ in range(n):
            t = time.perf_counter()
            output_from_msg(msg)
            lib.append(time.perf_counter() - t)
            t = time.perf_counter()
            _output_from(msg_type, content)
            ours.append(time.perf_counter() - t)
        out[msg_type] = {"nbformat_us": _us(lib), "ours_us": _us(ours)}
    return out


async def _alive() -> None:
    return None


async def receive(n: int) -> dict[str, float]:
    """Median microseconds for a kernel_info round trip, by which reader takes the reply."""
    run_dir = tempfile.mkdtemp(prefix="ks-bench-recv-")
    km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{run_dir}/k")
    await km.start_kernel()
    session = KernelSession(km.get_connection_info())  # type: ignore[arg-type]
    client = km.client()
    try:
        await session.connect(60, _alive)
        client.start_channels(hb=False, stdin=False)
        await client.wait_for_ready(timeout=60)

        async def library() -> tuple[str, Any]:
            msg_id = client.kernel_info()
            return msg_id, await client.shell_channel.get_msg(timeout=5)

        async def ours() -> tuple[str, Any]:
            msg_id = session._request("kernel_info_request")
            while (msg := await session._get_msg("shell", 5)) is None:
                pass
            return msg_id, msg

        readers: dict[str, Callable[[], Awaitable[Any]]] = {"library": library, "ours": ours}
        times: dict[str, list[float]] = {name: [] for name in readers}
        for i in range(n + 50):
            for name, read in readers.items():
                t = time.perf_counter()
                msg_id, reply = await read()
                took = time.perf_counter() - t
                assert reply["parent_header"]["msg_id"] == msg_id
                if i >= 50:  # warm-up
                    times[name].append(took)
        return {f"{name}_us": _us(samples) for name, samples in times.items()}
    finally:
        client.stop_channels()
        session.close()
        await km.shutdown_kernel(now=True)
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    result = {"outputs": outputs(args.n), "receive": asyncio.run(receive(args.n))}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
