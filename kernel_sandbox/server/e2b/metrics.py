"""A sandbox's CPU, memory and disk, measured inside it, for E2B's metrics route.

One short process beside the kernel, as the sandbox user, reads the sandbox's own
cgroup (v1 or v2: what the engine gives it) twice 0.2 s apart for the CPU share, and
``df`` of the working directory for the disk.  The same on every kernel host (it is
only ``exec``); where a figure cannot be read it is 0 and the limit comes from the
sandbox's configuration.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ...config import parse_size
from ...sandbox import AsyncSandbox
from .models import SandboxMetric, iso

__all__ = ["between", "sample"]

#: Prints "disk_total disk_used", then "mem_used mem_limit mem_cache cpu_ns_1 cpu_ns_2".
_SCRIPT = r"""
cg=/sys/fs/cgroup
if [ -r $cg/memory/memory.usage_in_bytes ]; then
  mu=$(cat $cg/memory/memory.usage_in_bytes); ml=$(cat $cg/memory/memory.limit_in_bytes)
  mc=$(awk '/^total_cache /{print $2}' $cg/memory/memory.stat)
  cpu() { cat $cg/cpuacct/cpuacct.usage 2>/dev/null || echo 0; }
elif [ -r $cg/memory.current ]; then
  mu=$(cat $cg/memory.current); ml=$(cat $cg/memory.max)
  mc=$(awk '/^file /{print $2}' $cg/memory.stat)
  cpu() { awk '/^usage_usec/{printf "%d\n", $2*1000}' $cg/cpu.stat; }
else
  mu=0; ml=0; mc=0; cpu() { echo 0; }
fi
a=$(cpu); sleep 0.2; b=$(cpu)
df -B1 -P "$1" 2>/dev/null | awk 'NR==2{print $2, $3}' || echo "0 0"
echo "$mu $ml ${mc:-0} $a $b"
"""


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


async def sample(sandbox: AsyncSandbox, cpu_count: int) -> SandboxMetric:
    """One metrics sample of ``sandbox`` (0.2 s of CPU time measured)."""
    result = await sandbox.host.exec(
        ["sh", "-c", _SCRIPT, "sh", sandbox.working_dir], max_output_bytes=4096, deadline=15.0
    )
    lines = result.stdout.decode(errors="replace").split("\n")
    disk = (lines[0].split() if lines else []) + ["0", "0"]
    mem = (lines[1].split() if len(lines) > 1 else []) + ["0"] * 5
    config = sandbox.config
    limit = parse_size(config.memory_limit)
    mem_limit = _int(mem[1])
    cpu_ns = max(0, _int(mem[4]) - _int(mem[3]))
    share = cpu_ns / 0.2e9 / max(config.cpu_limit, 0.01) * 100
    disk_total = _int(disk[0])
    if config.disk_limit:
        disk_total = min(disk_total or parse_size(config.disk_limit), parse_size(config.disk_limit))
    now = time.time()
    return SandboxMetric(
        timestamp=iso(now),
        timestamp_unix=int(now),
        cpu_count=cpu_count,
        cpu_used_pct=round(min(share, 100.0 * cpu_count), 2),
        mem_used=_int(mem[0]),
        mem_total=mem_limit if 0 < mem_limit < limit * 2 else limit,
        mem_cache=_int(mem[2]),
        disk_used=_int(disk[1]),
        disk_total=disk_total,
    )


def between(
    samples: Iterable[SandboxMetric],
    start: int | None,
    end: int | None,
    fresh: SandboxMetric | None = None,
) -> list[SandboxMetric]:
    """The samples from ``start`` to ``end`` (unix seconds, both included; None: open),
    oldest first; ``fresh``, taken for this ask, is in whatever second it fell."""
    low = start if start is not None else 0
    high = end if end is not None else float("inf")
    return [s for s in samples if s is fresh or low <= s.timestamp_unix <= high]
