"""The stall seen after the many-frames attack, looked for: attacks, then new sandboxes,
in one process, again and again.  ``python bench/guard_stall.py --transport ipc --loops 10``

Each loop opens a sandbox, sends it one iopub message of 50 frames of 8 MiB (cut by the
guard), then messages of many frames during a call and from a thread while the host
idles, runs ``print(6*7)``, closes it, and opens ``--after`` new sandboxes that must each
answer.  When libzmq's I/O thread blocked on a socket monitor whose reader was closed
(``kernel/channels.py``), every later connection of the process failed here within a
few loops (``gdb -p PID -batch -ex "thread apply all bt"`` showed ``ZMQbg/IO/0`` in
``zmq_msg_send``).  Exits 1 if any loop had a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from kernel_sandbox.sandbox import AsyncSandbox

LABEL = {"kernel-sandbox.bench": "1"}
MiB = 1024**2
FLOOD = 400 * MiB
CRAFT = """
import time
k = get_ipython().kernel
parent = k.get_parent()
def craft(socket, msg_type, content, count, buffers=()):
    for _ in range(count):
        k.session.send(socket, msg_type, content, parent=parent, buffers=list(buffers))
"""
ONE = (
    CRAFT
    + f"""
big = b"f" * {8 * MiB}
craft(k.iopub_socket, "stream", {{"name": "stdout", "text": "x"}}, 1, [big] * {FLOOD // (8 * MiB)})
print("sent")
"""
)
MANY = (
    CRAFT
    + f"""
import sys, threading
part = b"g" * (4 * 1024**2)
craft(k.iopub_socket, "stream", {{"name": "stdout", "text": "y"}}, {FLOOD // (16 * MiB)},
      [part] * 4)
def later():
    time.sleep(1)
    sys.stdout.flush()  # the cell's "sent" first: a timed flush may come late
    for _ in range({FLOOD // (48 * MiB)}):
        craft(k.iopub_socket, "stream", {{"name": "stdout", "text": "z"}}, 1, [part] * 12)
        time.sleep(0.3)
threading.Thread(target=later).start()
print("sent")
"""
)


async def one_loop(transport: str, after: int) -> tuple[str, list[str]]:
    failures: list[str] = []
    sandbox = await AsyncSandbox.create(
        image="kernel-sandbox:python", transport=transport, interrupt_grace=2.0, labels=LABEL
    )
    try:
        first = await sandbox.run_python(ONE, timeout=60)
        second = await sandbox.run_python(MANY, timeout=60)
        await asyncio.sleep(5)  # the host reads nothing meanwhile
        third = await sandbox.run_python("print(6*7)")
        sent = "sent" if second.stdout.endswith("sent\n") else "NO 'sent'"
        attack = f"{first.status}/{second.status} {sent}/{third.status} {third.stdout.strip()!r}"
        if sent != "sent" or third.stdout != "42\n":
            failures.append("the attacked sandbox itself")
    finally:
        await sandbox.close()
    for _ in range(after):
        try:
            async with await AsyncSandbox.create(
                image="kernel-sandbox:python", transport=transport, labels=LABEL
            ) as fresh:
                ex = await asyncio.wait_for(fresh.run_python("print(6*7)"), 60)
                if ex.stdout != "42\n":
                    failures.append(ex.text[:200])
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}"[:200])
    return attack, failures


async def main(transport: str, loops: int, after: int) -> int:
    bad = 0
    for i in range(loops):
        start = time.monotonic()
        attack, failures = await one_loop(transport, after)
        bad += bool(failures)
        print(
            f"{transport} loop {i}: attack {attack}; later sandboxes "
            f"{after - len(failures)}/{after} ok {failures or ''} "
            f"({time.monotonic() - start:.0f} s)",
            flush=True,
        )
    print(f"{transport}: {loops - bad}/{loops} loops without a failure")
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transport", default="ipc", choices=["ipc", "tcp"])
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument("--after", type=int, default=2)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.transport, args.loops, args.after)))
