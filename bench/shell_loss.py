"""How often a short shell command's output is lost under load: a rate, not a timing.

``python -m bench.shell_loss [--sandboxes 20] [--calls 1000] [--in-flight 3] [--busy 2]``
runs ``echo <token>`` on every sandbox with several calls in flight each, while
``--busy`` threads keep the GIL busy (a loaded host process reads engine responses
late, which is what used to lose output: see kernel_sandbox/backends/docker/attach.py).
Prints one JSON line: calls whose stdout came back empty with exit code 0 (``empty``),
any other wrong result (``wrong``) and errors.  Run it against another checkout with
``PYTHONPATH=<checkout>`` to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

from kernel_sandbox.sandbox import AsyncSandbox


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=20)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=3, help="calls in flight per sandbox")
    parser.add_argument("--busy", type=int, default=2, help="threads that keep the GIL busy")
    parser.add_argument("--image", default="kernel-sandbox:python")
    args = parser.parse_args()
    sandboxes = await asyncio.gather(
        *(AsyncSandbox.create(image=args.image) for _ in range(args.sandboxes))
    )
    stop = threading.Event()
    for _ in range(args.busy):
        threading.Thread(target=_spin, args=(stop,), daemon=True).start()
    gate = asyncio.Semaphore(args.in_flight * args.sandboxes)
    counts = {"empty": 0, "wrong": 0, "errors": 0}

    async def call(i: int) -> None:
        async with gate:
            try:
                result = await sandboxes[i % len(sandboxes)].run_shell(f"echo tk-{i}")
            except Exception:
                counts["errors"] += 1
                return
        if result.exit_code == 0 and result.stdout == "":
            counts["empty"] += 1
        elif result.stdout != f"tk-{i}\n":
            counts["wrong"] += 1

    started = time.monotonic()
    try:
        await asyncio.gather(*(call(i) for i in range(args.calls)))
    finally:
        stop.set()
        await asyncio.gather(*(sandbox.close() for sandbox in sandboxes))
    print(json.dumps({**vars(args), **counts, "wall_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
