"""Where a ``print(1+1)`` round trip goes: both sides profiled at once.

    python bench/profile_roundtrip.py --calls 3000          # local kernel, our flags + client
    python bench/profile_roundtrip.py --sandbox             # a real sandbox (kernel in Docker)

The client side (this process: KernelSession.execute, jupyter_client's Session, pyzmq,
asyncio) runs under cProfile; the kernel process is sampled by py-spy (``pip install
py-spy``; sampling a container's kernel from the host needs root).  Prints the client's
top functions by own time, and the kernel's samples as inclusive shares of the frames
that matter, plus its top frames by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import itertools
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from baselines import TUNED_KERNEL_ARGS  # noqa: E402

from kernel_sandbox.kernel.client import KernelSession  # noqa: E402


async def _alive() -> None:
    return None


async def local_session(kernel: str) -> tuple[KernelSession, int, object]:
    from jupyter_client.manager import AsyncKernelManager

    run_dir = tempfile.mkdtemp(prefix="ks-prof-")
    km = AsyncKernelManager(kernel_name=kernel, transport="ipc", ip=f"{run_dir}/k")
    await km.start_kernel(extra_arguments=TUNED_KERNEL_ARGS)
    session = KernelSession(km.get_connection_info())  # type: ignore[arg-type]
    await session.connect(60, _alive)
    pid = km.provisioner.process.pid  # type: ignore[union-attr]
    return session, pid, km


async def main(args: argparse.Namespace) -> None:
    sandbox = km = None
    if args.sandbox:
        from kernel_sandbox.sandbox import AsyncSandbox

        sandbox = await AsyncSandbox.create(image=args.image)
        session = sandbox._kernel.session  # type: ignore[attr-defined]
        top = subprocess.run(
            ["docker", "top", sandbox.container_id, "-eo", "pid,args"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[1:]
        # the kernel is the last process with IPKernelApp in its command line (the
        # init and the supervisor's shell carry the same text as arguments)
        pid = int([line for line in top if "IPKernelApp" in line][-1].split()[0])
    else:
        session, pid, km = await local_session(args.kernel)

    async def call() -> None:
        await session.execute("print(1+1)", timeout=30, interrupt_grace=2, check_alive=_alive)

    for _ in range(50):
        await call()
    await timeline(session, args.calls // 3)
    await cpu_per_call(call, pid, args.calls // 3)
    if args.cpu_only:
        await _close(sandbox, session, km)
        return
    await kernel_cprofile(session, args.calls // 3, args.top)
    out = Path(tempfile.mkdtemp(prefix="ks-prof-out-"))
    spy = subprocess.Popen(
        [
            *("py-spy", "record", "--pid", str(pid), "--rate", str(args.rate), "--nonblocking"),
            *("--format", "raw", "--output", str(out / "kernel.txt"), "--threads"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.sleep(1.5)  # py-spy attaches
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for _ in range(args.calls):
        await call()
    profiler.disable()
    per_call = (time.perf_counter() - t0) / args.calls
    spy.send_signal(2)
    spy.wait(30)
    print(f"{args.calls} calls, {per_call * 1000:.2f} ms a call under the profilers\n")
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(args.top)
    print("client (cProfile, by own time):")
    print("\n".join(buf.getvalue().splitlines()[4:]))
    kernel_report(out / "kernel.txt", args.top)
    shutil.rmtree(out, ignore_errors=True)
    await _close(sandbox, session, km)


async def _close(sandbox: object, session: KernelSession, km: object) -> None:
    if sandbox is not None:
        await sandbox.close()  # type: ignore[attr-defined]
    else:
        session.close()
        await km.shutdown_kernel(now=True)  # type: ignore[attr-defined]


async def timeline(session: KernelSession, calls: int) -> None:
    """Median time of each step of a call, from the kernel's message timestamps.

    The kernel stamps every message it sends (``header.date``, microseconds); the host
    notes when it sent the request and when each message arrived.  Both read the same
    clock (a container shares the host's), so the steps add up to the round trip.
    """
    from datetime import datetime

    steps: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
    for _ in range(calls):
        sent = time.time()
        msg_id = session._execute_request("print(1+1)", store_history=True)
        marks = [("request sent", sent)]
        while True:
            msg = await session._get_msg("iopub", 5)
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "status":
                kind = msg["content"]["execution_state"]
            stamp = msg["header"]["date"]
            stamp = stamp if isinstance(stamp, datetime) else datetime.fromisoformat(stamp)
            marks.append((f"kernel sends {kind}", stamp.timestamp()))
            marks.append((f"host has {kind}", time.time()))
            if kind == "idle":
                break
        while True:
            msg = await session._get_msg("shell", 5)
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                stamp = msg["header"]["date"]
                stamp = stamp if isinstance(stamp, datetime) else datetime.fromisoformat(stamp)
                marks.append(("kernel sends execute_reply", stamp.timestamp()))
                marks.append(("host has execute_reply", time.time()))
                break
        marks.sort(key=lambda m: m[1])
        for (_, a), (name, b) in itertools.pairwise(marks):
            steps[name].append(b - a)
        steps["TOTAL"].append(marks[-1][1] - sent)
    print(f"timeline of {calls} calls (median ms of the step that ends with each event):")
    for name, values in steps.items():
        values.sort()
        print(f"  {values[len(values) // 2] * 1000:7.3f}  {name}")
    print()


async def cpu_per_call(call: object, pid: int, calls: int) -> None:
    """CPU time a call costs each side (no profiler): this process and the kernel's.

    On 2 shared cores the sum bounds the calls per second the machine can do at all.
    """
    tick = os.sysconf("SC_CLK_TCK")

    def kernel_cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    k0, c0, t0 = kernel_cpu(), time.process_time(), time.perf_counter()
    for _ in range(calls):
        await call()  # type: ignore[operator]
    wall = (time.perf_counter() - t0) / calls * 1000
    client = (time.process_time() - c0) / calls * 1000
    kernel = (kernel_cpu() - k0) / calls * 1000
    print(f"CPU per call over {calls} calls: client {client:.3f} ms, kernel {kernel:.3f} ms")
    print(f"  (wall {wall:.3f} ms a call; 2 cores allow <= {2000 / (client + kernel):.0f}/s)\n")


async def kernel_cprofile(session: KernelSession, calls: int, top: int) -> None:
    """cProfile inside the kernel (its main thread: dispatch, IPython, the reply) over
    ``calls`` calls; the profiler's own cells are left out of the figures."""

    async def run(code: str) -> list[dict[str, object]]:
        raw = await session.execute(code, timeout=60, interrupt_grace=2, check_alive=_alive)
        return raw.outputs

    await run("import cProfile as _cp, pstats as _ps, io as _io\n_prof = _cp.Profile()")
    await run("_prof.enable()")
    for _ in range(calls):
        await run("print(1+1)")
    await run("_prof.disable()")
    outputs = await run(
        "_buf = _io.StringIO()\n"
        f"_ps.Stats(_prof, stream=_buf).sort_stats('tottime').print_stats({top})\n"
        "print(_buf.getvalue())"
    )
    text = "".join(str(o.get("text", "")) for o in outputs)
    print(f"kernel main thread (cProfile over {calls} calls, by own time):")
    print("\n".join(line[:160] for line in text.splitlines()[: top + 12]))


#: Frames whose inclusive share of the kernel's samples tells where a call goes.
MARKERS = (
    "dispatch_shell",
    "execute_request",
    "run_cell",
    "run_ast_nodes",
    "run_code",
    "transform_cell",
    "compile",
    "send",
    "publish_status",
    "flush",
    "_flush",
    "_event_pipe_gc",
    "_handle_event",
    "_really_send",
    "serialize",
    "sign",
    "json_packer",
    "should_handle",
    "select",
    "poll",
    "epoll",
)


def kernel_report(path: Path, top: int) -> None:
    """Summarise py-spy's collapsed stacks: inclusive shares of MARKERS, top own frames."""
    if not path.exists():
        print("\nkernel: py-spy wrote nothing (is py-spy installed, are we root?)")
        return
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        threads[frames[0]] += n
        names = {f.split(" (")[0].rsplit(".", 1)[-1] for f in frames}
        for m in MARKERS:
            if m in names:
                inclusive[m] += n
        own[frames[-1]] += n
    print(f"\nkernel (py-spy, {total} samples, idle included):")
    for name, n in threads.most_common():
        print(f"  {n / total:6.1%}  {name}")
    print("  inclusive:")
    for name, n in inclusive.most_common():
        print(f"  {n / total:6.1%}  {name}")
    print("  own time:")
    for name, n in own.most_common(top):
        print(f"  {n / total:6.1%}  {name[:150]}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sandbox", action="store_true", help="profile a real sandbox's kernel")
    p.add_argument("--image", default="kernel-sandbox:datascience")
    p.add_argument("--cpu-only", action="store_true", help="timeline and CPU, no profilers")
    p.add_argument("--kernel", default="python3", help="local kernelspec (e.g. another ipykernel)")
    asyncio.run(main(p.parse_args()))
