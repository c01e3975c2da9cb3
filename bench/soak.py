"""Load / soak: many executions on many sandboxes at once, every result checked.

    python bench/soak.py        # 10 000 calls on 20 sandboxes, and 1 000 on 1 as a baseline
    python bench/soak.py --calls 2000 --sandboxes 20 --baseline-calls 0

Each call carries a unique token and must come back with exactly its own output:
``run_python`` prints the token and returns ``token-ret`` as its execute_result,
``run_shell`` echoes it, a file write + read round-trips it.  Several calls are in
flight per sandbox (the sandbox serialises them), so a result handed to the wrong
caller shows up as *misrouted*, a second copy as *duplicated*, a missing or failed one
as *lost*.  Host memory (VmRSS), open file descriptors and threads are sampled while
the load runs, to catch leaks in the host-side client.  tests/integration/test_soak.py
runs the same driver with a bound on RSS growth.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_sandbox.sandbox import AsyncSandbox

DEFAULT_IMAGE = "kernel-sandbox:python"
#: Tokens look like ``tk-<sandbox>-<call>``; any such string in an output is a token.
TOKEN = re.compile(r"tk-\d+-\d+")
MOMENTS = ("before", "warm", "end", "after")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def rss_kb() -> int:
    """Resident memory of this process in KiB (VmRSS)."""
    return _status("VmRSS")


def os_threads() -> int:
    """Threads of this process, native ones (zmq, docker SDK pools) included."""
    return _status("Threads")


def open_fds() -> int:
    """File descriptors open in this process."""
    return len(os.listdir("/proc/self/fd"))


@dataclass
class SoakReport:
    """Counts and resource samples of one soak run."""

    sandboxes: int
    calls: int
    in_flight: int
    wall: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    correct: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: int = 0
    misrouted: list[str] = field(default_factory=list)
    #: (calls completed, VmRSS KiB) samples; the first is taken before the first call.
    rss: list[tuple[int, int]] = field(default_factory=list)
    warmup_calls: int = 0
    #: Open descriptors and OS threads ``before`` the sandboxes start, once ``warm``,
    #: at the ``end`` of the load (sandboxes still open) and ``after`` they are closed.
    fds: dict[str, int] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)

    def sample_handles(self, moment: str) -> None:
        """Record descriptors and threads at one of the four moments."""
        self.fds[moment], self.threads[moment] = open_fds(), os_threads()

    @property
    def rss_after_warmup(self) -> int:
        """The first RSS sample taken once ``warmup_calls`` calls were done."""
        return next(kb for done, kb in self.rss if done >= self.warmup_calls)

    @property
    def rss_growth_kb(self) -> int:
        """RSS at the end minus RSS after warm-up."""
        return self.rss[-1][1] - self.rss_after_warmup

    @property
    def rss_slope_kb_per_1000(self) -> float:
        """Least-squares slope of RSS over calls after warm-up, KiB per 1 000 calls."""
        points = [(d, kb) for d, kb in self.rss if d >= self.warmup_calls]
        if len(points) < 2:
            return 0.0
        mx = sum(d for d, _ in points) / len(points)
        my = sum(kb for _, kb in points) / len(points)
        den = sum((d - mx) ** 2 for d, _ in points)
        num = sum((d - mx) * (kb - my) for d, kb in points)
        return 1000 * num / den if den else 0.0

    def row(self) -> dict[str, Any]:
        """The figures of the table, by column."""
        return {
            "sandboxes": self.sandboxes,
            "calls": self.calls,
            "in flight": self.in_flight,
            "wall s": round(self.wall, 1),
            "calls/s": round(self.calls / self.wall, 1) if self.wall else 0.0,
            "RSS start MB": round(self.rss[0][1] / 1024, 1),
            "RSS warm MB": round(self.rss_after_warmup / 1024, 1),
            "RSS end MB": round(self.rss[-1][1] / 1024, 1),
            "slope KB/1k": round(self.rss_slope_kb_per_1000, 1),
            "fds before/warm/end/after": "/".join(str(self.fds[m]) for m in MOMENTS),
            "threads before/warm/end/after": "/".join(str(self.threads[m]) for m in MOMENTS),
            "correct": self.correct,
            "lost": len(self.lost),
            "dup": self.duplicated,
            "misrouted": len(self.misrouted),
        }


class _Checker:
    """Runs one call of each kind and files its outcome in the report."""

    def __init__(self, report: SoakReport) -> None:
        self.report = report

    def _file(self, token: str, kind: str, got: str, expected: str, detail: str = "") -> None:
        report = self.report
        report.kinds[kind] += 1
        found = TOKEN.findall(got)
        if got == expected:
            report.correct += 1
        elif any(t != token for t in found):
            report.misrouted.append(f"{kind} {token}: got {got[:200]!r}")
        elif len(found) > len(TOKEN.findall(expected)):
            report.duplicated += 1
        else:
            report.lost.append(f"{kind} {token}: got {got[:200]!r} {detail[:200]}".rstrip())

    async def python(self, sandbox: AsyncSandbox, token: str) -> None:
        execution = await sandbox.run_python(f"print({token!r})\n{token + '-ret'!r}", timeout=120)
        result = execution.result
        value = result["data"].get("text/plain", "") if result else ""
        got = f"{execution.status}|{execution.stdout}|{value}"
        self._file(token, "python", got, f"ok|{token}\n|{token + '-ret'!r}")

    async def shell(self, sandbox: AsyncSandbox, token: str) -> None:
        result = await sandbox.run_shell(f"echo {token}", timeout=120)
        got = f"{result.exit_code}|{result.stdout}"
        detail = f"(stderr {result.stderr!r}, {result.duration:.2f} s)"
        self._file(token, "shell", got, f"0|{token}\n", detail)

    async def file(self, sandbox: AsyncSandbox, token: str) -> None:
        path = f"soak/{token}.txt"
        await sandbox.files.write(path, token)
        got = (await sandbox.files.read(path)).decode()
        self._file(token, "file", got, token)

    async def call(self, sandbox: AsyncSandbox, token: str, number: int) -> None:
        """Python for 7 calls in 10, shell for 2, a file round trip for 1."""
        kind = number % 10
        try:
            if kind < 7:
                await self.python(sandbox, token)
            elif kind < 9:
                await self.shell(sandbox, token)
            else:
                await self.file(sandbox, token)
        except Exception as exc:  # a raised call is a lost result, counted, not fatal
            self.report.lost.append(f"{token}: raised {type(exc).__name__}: {exc}")


async def _open(count: int, image: str, labels: dict[str, str]) -> list[AsyncSandbox]:
    gate = asyncio.Semaphore(4)  # starting 20 containers at once only queues in the engine

    async def one() -> AsyncSandbox:
        async with gate:
            return await AsyncSandbox.create(image=image, labels=labels)

    made = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    good = [s for s in made if isinstance(s, AsyncSandbox)]
    failed = [s for s in made if not isinstance(s, AsyncSandbox)]
    if failed:
        await asyncio.gather(*(s.close() for s in good))
        raise RuntimeError(f"{len(failed)} of {count} sandboxes did not start: {failed[0]}")
    return good


async def run_soak(
    calls: int,
    sandboxes: int,
    *,
    in_flight: int = 4,
    image: str = DEFAULT_IMAGE,
    labels: dict[str, str] | None = None,
    sample_every: int = 100,
    warmup_fraction: float = 0.2,
) -> SoakReport:
    """Run ``calls`` checked calls spread over ``sandboxes`` sandboxes; closes them after.

    ``in_flight`` tasks per sandbox submit calls concurrently.  RSS is sampled every
    ``sample_every`` completed calls; the first ``warmup_fraction`` of the calls are
    warm-up (caches, lazily imported modules, connection pools fill up there).
    """
    warmup = max(1, int(calls * warmup_fraction))
    report = SoakReport(sandboxes, calls, in_flight, warmup_calls=warmup)
    checker = _Checker(report)
    report.sample_handles("before")
    boxes = await _open(sandboxes, image, labels or {})
    try:
        per_box = [range(i, calls, sandboxes) for i in range(sandboxes)]
        done = 0
        report.rss.append((0, rss_kb()))

        async def worker(box: int, numbers: range) -> None:
            nonlocal done
            for number in numbers:
                await checker.call(boxes[box], f"tk-{box}-{number}", number)
                done += 1
                if done == report.warmup_calls:
                    report.sample_handles("warm")
                if done % sample_every == 0:
                    report.rss.append((done, rss_kb()))

        started = time.monotonic()
        await asyncio.gather(
            *(
                worker(box, numbers[lane::in_flight])
                for box, numbers in enumerate(per_box)
                for lane in range(in_flight)
            )
        )
        report.wall = time.monotonic() - started
        if report.rss[-1][0] != done:
            report.rss.append((done, rss_kb()))
        report.sample_handles("end")
    finally:
        await asyncio.gather(*(s.close() for s in boxes), return_exceptions=True)
    report.sample_handles("after")
    return report


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """Rows of :meth:`SoakReport.row` as an aligned text table, one run per column."""
    keys = list(rows[0][1])
    width = max(len(k) for k in keys) + 2
    cols = [max(len(name), *(len(str(r[k])) for k in keys)) + 2 for name, r in rows]
    head = " " * width + "".join(f"{name:>{w}}" for (name, _), w in zip(rows, cols, strict=True))
    lines = [head]
    for key in keys:
        cells = "".join(f"{r[key]!s:>{w}}" for (_, r), w in zip(rows, cols, strict=True))
        lines.append(f"{key:<{width}}{cells}")
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> int:
    labels = {"kernel-sandbox.bench": "soak"}
    runs = []
    if args.baseline_calls:
        base = await run_soak(
            args.baseline_calls, 1, in_flight=args.in_flight, image=args.image, labels=labels
        )
        runs.append(("1 sandbox", base))
    load = await run_soak(
        args.calls, args.sandboxes, in_flight=args.in_flight, image=args.image, labels=labels
    )
    runs.append((f"{args.sandboxes} sandboxes", load))
    print(table([(name, r.row()) for name, r in runs]))
    for name, r in runs:
        for problem in (r.lost + r.misrouted)[:10]:
            print(f"{name}: {problem}")
    return 0 if all(not r.lost and not r.misrouted and not r.duplicated for _, r in runs) else 1


def main() -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--sandboxes", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=4, help="concurrent calls per sandbox")
    parser.add_argument(
        "--baseline-calls", type=int, default=1000, help="the same load on 1 sandbox; 0 skips it"
    )
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
