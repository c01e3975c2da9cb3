"""kernel_sandbox benchmark: one command, one table, one JSON file, baselines in the same run.

    make bench                                  # everything, modest sizes (~5 min)
    python bench/run.py --parts latency,baselines --calls 500
    python bench/run.py --alive 60              # density: 60 idle sandboxes at once
    python bench/run.py --parts gvisor          # runc beside gVisor's runsc (needs runsc)

Figures are taken on whatever else the machine is doing, so the table also gives them
as ratios to baselines measured in the same run (a bare ``docker run``, a local
ipykernel, ms-enclave 0.0.8's ``python_executor``).  JSON goes to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402
import gvisor  # noqa: E402
import ours  # noqa: E402

#: (result name, launched with our kernel flags, driven by our KernelSession)
LOCAL_KERNELS = (
    ("local_kernel", False, False),
    ("local_kernel_tuned", True, False),
    ("local_kernel_ours", True, True),
)
PARTS = ("cold", "pool", "latency", "throughput", "density", "baselines", "gvisor")
#: Parts run when --parts is not given (gvisor needs the runsc runtime on the engine).
DEFAULT_PARTS = PARTS[:-1]
DEFAULT_IMAGE = "kernel-sandbox:datascience"


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the two nearest ranks."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: list[float], qs: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    out = {f"p{q}": pct(values, q) for q in qs}
    out["n"] = len(values)
    return out


def machine() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:  # information only
            return ""

    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "docker": run("docker", "version", "--format", "{{.Server.Version}}"),
        "git": run("git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"),
        "loadavg_start": os.getloadavg(),
        "host_kernel_packages": {m: _version(m) for m in ("ipykernel", "ipython", "pyzmq")},
        "image_kernel_packages": run(
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/opt/venv/bin/python",
            DEFAULT_IMAGE,
            "-c",
            "from importlib.metadata import version as v; "
            "print(*(f'{m}={v(m)}' for m in ('ipykernel', 'ipython', 'pyzmq')))",
        ),
    }


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "-"


async def measure(args: argparse.Namespace, parts: set[str], log: Any) -> dict[str, Any]:
    r: dict[str, Any] = {}
    image = args.image
    # Round trips first: the start/remove churn of the other parts keeps the engine busy
    # for a while after each call returns.
    if "latency" in parts:
        log(f"round trips: print(1+1) x {args.calls}, 1 MB stdout and PNG x {args.big}")
        r["latency"] = await ours.round_trips(image, args.calls, args.big)
    if "cold" in parts:
        log(f"cold start: {args.cold} sandboxes in a row on {image}")
        r["cold"] = await ours.cold_start(image, args.cold)
        log("cold start: 4 sandboxes at the same moment")
        r["parallel_start_4"] = [await ours.parallel_start(image, 4) for _ in range(2)]
    if "pool" in parts:
        log(f"warm pool: {args.acquires} acquisitions")
        r["pool"] = await ours.warm_pool(image, args.acquires, size=2)
    if "throughput" in parts:
        counts = [int(c) for c in args.throughput.split(",")]
        log(f"throughput over {counts} sandboxes, {args.seconds:g} s each")
        r["throughput"] = await ours.throughput(image, counts, args.seconds)
    if "density" in parts:
        log(f"density: {args.alive} idle sandboxes at once")
        r["density"] = await ours.density(image, args.alive, args.concurrency)
    if "gvisor" in parts:
        log(
            f"runc beside runsc: {args.gvisor_cold} cold starts, {args.calls} round trips, "
            f"{args.gvisor_idle} idle sandboxes each"
        )
        r["gvisor"] = await gvisor.compare(
            image, ("runc", "runsc"), args.gvisor_cold, args.calls, args.gvisor_idle
        )
    if "baselines" in parts:
        log(f"baseline: docker run --rm {image} true x {args.docker_runs}")
        r["docker_run_true"] = baselines.docker_run_true(image, args.docker_runs)
        for name, tuned, our_client in LOCAL_KERNELS:
            log(f"baseline: {name.replace('_', ' ')} (no container), {args.calls} calls")
            r[name] = await baselines.local_kernel(args.calls, 3, tuned, our_client)
        log(f"baseline: ms-enclave 0.0.8 python_executor, {args.msenclave_calls} calls")
        try:
            r["msenclave"] = await asyncio.to_thread(baselines.msenclave, 3, args.msenclave_calls)
        except Exception as exc:  # reported in the table; the rest stands
            r["msenclave"] = {"error": f"{type(exc).__name__}: {exc}"}
    return r


def rows(r: dict[str, Any], args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """(metric, value, target/verdict, ratio) lines of the table."""
    out: list[tuple[str, str, str, str]] = []
    ms = 1000.0

    def verdict(ok: bool, target: str) -> str:
        return f"{'OK  ' if ok else 'MISS'} {target}"

    docker_p50 = pct(r["docker_run_true"], 50) if "docker_run_true" in r else None
    local = r.get("local_kernel", {}).get("latency")
    mse = r.get("msenclave", {})
    mse_lat = mse.get("latency") or None
    if "cold" in r:
        c = r["cold"]
        p50 = pct(c["total"], 50)
        ratio = f"{p50 / docker_p50:.2f}x docker run true" if docker_p50 else ""
        out.append(
            (
                "cold start create->first result p50/p95",
                f"{p50:.3f} / {pct(c['total'], 95):.3f} s",
                verdict(p50 <= 0.8, "<= 0.8 s"),
                ratio,
            )
        )
        for key, label in (
            ("engine_create", "  engine create"),
            ("engine_start", "  engine start"),
            ("start_to_kernel_exec", "  start -> kernel process exec"),
            ("kernel_exec_to_ready", "  kernel exec -> ready (imports, connect)"),
            ("first_call", "  first call"),
            ("close", "  close (remove)"),
        ):
            out.append((label, f"{pct(c[key], 50) * ms:.0f} ms p50", "", ""))
    if "parallel_start_4" in r:
        both = r["parallel_start_4"]
        out.append(("4 sandboxes started at once, all answered", f"{min(both):.2f} s", "", ""))
    if "pool" in r:
        a = r["pool"]["acquire"]
        out.append(
            (
                "warm pool acquire p50/p95",
                f"{pct(a, 50) * ms:.2f} / {pct(a, 95) * ms:.2f} ms",
                verdict(pct(a, 50) * ms <= 20, "<= 20 ms"),
                "",
            )
        )
        f = r["pool"]["acquire_to_first_result"]
        out.append(("warm pool acquire -> first result p50", f"{pct(f, 50) * ms:.2f} ms", "", ""))
    if "latency" in r:
        lat = r["latency"]["print"]
        p50 = pct(lat, 50)
        ratios = []
        if local:
            ratios.append(f"{p50 / pct(local, 50):.2f}x local ipykernel")
        if mse_lat:
            ratios.append(f"{pct(mse_lat, 50) / p50:.0f}x faster than ms-enclave")
        fast_enough = bool(mse_lat) and pct(mse_lat, 50) / p50 >= 30
        out.append(
            (
                f"print(1+1) round trip p50/p99 (n={len(lat)})",
                f"{p50 * ms:.2f} / {pct(lat, 99) * ms:.2f} ms",
                verdict(p50 * ms <= 5 and fast_enough, "<= 5 ms, >= 30x ms-enclave"),
                ", ".join(ratios),
            )
        )
        for key, label in (
            ("stdout_1mb", "1 MB stdout round trip p50"),
            ("png", "matplotlib PNG round trip p50"),
            ("png_first_with_import", "first PNG (imports matplotlib)"),
        ):
            out.append((label, f"{pct(r['latency'][key], 50) * ms:.1f} ms", "", ""))
    if "throughput" in r:
        for k, rate in r["throughput"].items():
            out.append((f"throughput, {k} sandbox(es) at once", f"{rate:.0f} calls/s", "", ""))
    if "density" in r:
        d = r["density"]
        out.append(
            (
                f"sandboxes alive at once (of {d['requested']})",
                f"{d['alive']} in {d['seconds_to_start_all']:.1f} s",
                verdict(d["alive"] >= 50, ">= 50") if d["requested"] >= 50 else "(--alive 60)",
                "",
            )
        )
        out.append(
            (
                "memory per idle sandbox (cgroup, p50)",
                f"{statistics.median(d['cgroup_mem_per_sandbox_mb']):.1f} MB",
                "",
                f"host MemAvailable drop {d['host_mem_per_sandbox_mb']:.1f} MB each",
            )
        )
        out.append(
            (
                "processes / threads per idle sandbox",
                f"{statistics.median(d['processes_per_sandbox']):.0f} / "
                f"{statistics.median(d['threads_per_sandbox']):.0f}",
                "",
                "",
            )
        )
    if docker_p50 is not None:
        out.append(("baseline: docker run --rm IMAGE true p50", f"{docker_p50:.3f} s", "", ""))
    for name, label in (
        ("local_kernel", "stock"),
        ("local_kernel_tuned", "our flags"),
        ("local_kernel_ours", "our flags + client"),
    ):
        if name in r:
            lk = r[name]
            out.append(
                (
                    f"baseline: local ipykernel ({label}) print p50/p99",
                    f"{pct(lk['latency'], 50) * ms:.2f} / {pct(lk['latency'], 99) * ms:.2f} ms",
                    "",
                    f"start->first result {pct(lk['cold'], 50):.2f} s",
                )
            )
    if "msenclave" in r:
        if "error" in mse:
            out.append(("baseline: ms-enclave python_executor", "failed", "", mse["error"][:60]))
        else:
            out.append(
                (
                    "baseline: ms-enclave python_executor p50/p99",
                    f"{pct(mse_lat or [], 50) * ms:.1f} / {pct(mse_lat or [], 99) * ms:.1f} ms",
                    "",
                    f"start->first result {pct(mse['cold'], 50):.2f} s",
                )
            )
    if "gvisor" in r:
        out.extend(gvisor_rows(r["gvisor"]))
    return out


def gvisor_rows(g: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """runc and runsc side by side, runsc also as a ratio of runc."""
    out: list[tuple[str, str, str, str]] = []
    for key, label, scale, unit in (
        ("cold", "cold start create->first result p50", 1.0, "s"),
        ("round_trip", "print(1+1) round trip p50", 1000.0, "ms"),
        ("idle_mb", "idle sandbox memory (cgroup) p50", 1.0, "MB"),
    ):
        base = pct(g["runc"][key], 50)
        for rt in ("runc", "runsc"):
            value = pct(g[rt][key], 50)
            p95 = f" (p95 {pct(g[rt][key], 95) * scale:.3g})" if key != "idle_mb" else ""
            ratio = f"{value / base:.2f}x runc" if rt == "runsc" and base else ""
            out.append((f"{label}, {rt}", f"{value * scale:.3g} {unit}{p95}", "", ratio))
    return out


def table(lines: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    header = ("metric", "value", "target", "ratio / note")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*header), sep, *(fmt.format(*line) for line in lines)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--parts", default=",".join(DEFAULT_PARTS), help=f"comma list of {', '.join(PARTS)}"
    )
    p.add_argument("--image", default=DEFAULT_IMAGE, help="sandbox image (default: %(default)s)")
    p.add_argument("--calls", type=int, default=200, help="print(1+1) round trips (>= 100)")
    p.add_argument("--cold", type=int, default=10, help="cold starts in a row")
    p.add_argument("--acquires", type=int, default=30, help="warm pool acquisitions")
    p.add_argument("--big", type=int, default=10, help="1 MB stdout and PNG round trips")
    p.add_argument("--throughput", default="1,4,16", help="sandbox counts for throughput")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per throughput step")
    p.add_argument("--alive", type=int, default=20, help="idle sandboxes started at once")
    p.add_argument("--concurrency", type=int, default=4, help="sandboxes starting at once")
    p.add_argument("--docker-runs", type=int, default=5, help="bare docker run baselines")
    p.add_argument("--msenclave-calls", type=int, default=30, help="ms-enclave round trips")
    p.add_argument("--gvisor-cold", type=int, default=5, help="cold starts per runtime (gvisor)")
    p.add_argument("--gvisor-idle", type=int, default=3, help="idle sandboxes per runtime (gvisor)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/)")
    args = p.parse_args(argv)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")

    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    info = machine()
    results = asyncio.run(measure(args, parts, log))
    info["loadavg_end"] = os.getloadavg()
    info["seconds"] = round(time.time() - started, 1)
    lines = rows(results, args)
    text = table(lines)
    print(text)
    load = " -> ".join(
        "/".join(f"{x:.1f}" for x in info[k]) for k in ("loadavg_start", "loadavg_end")
    )
    host = " ".join(f"{k}={v}" for k, v in info["host_kernel_packages"].items())
    print(f"\nimage {args.image} ({info['image_kernel_packages']}); local kernels: {host}")
    print(f"{info['cpus']} CPUs, load average {load}, {info['seconds']:.0f} s")
    out = args.out or HERE / "results" / time.strftime("bench-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    summaries = {name: value for name, value, _, _ in lines}
    payload = {
        "command": command.strip(),
        "machine": info,
        "args": vars(args) | {"out": str(out)},
        "summary": summaries,
        "raw": results,
    }
    out.write_text(json.dumps(payload, indent=1, default=str))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
