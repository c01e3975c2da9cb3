"""Server replicas on Kubernetes and ``--workers`` on Docker, in one run (issue 27).

    KUBECONFIG=... python bench/replicas.py              # 30 clients, 20 s per configuration
    python bench/replicas.py --clients 50 --seconds 20 --parts kubernetes,docker
    python bench/replicas.py --parts docker --old /work/main --profile   # A/B, py-spy --gil
    python bench/replicas.py --parts docker --old /work/main --spread sticky   # A/B
    KUBECONFIG=... python bench/replicas.py --parts kubernetes --turns off,on   # A/B
    KUBECONFIG=... python bench/replicas.py --parts kubernetes --turns off,on --spread sticky

30 clients by default, not the issue's 50: each sandbox pod requests 50m CPU
(backends/kubernetes/manifests.py CPU_REQUEST) and each server replica 100m, so a 2-core
node schedules at most 34 sandboxes beside 3 replicas (the 35th stays Pending:
"Insufficient cpu").  Give ``--clients 50`` on a node with 3 or more cores.

Kubernetes (the cluster KUBECONFIG names, else scripts/k8s/cluster.sh's): deploy/kubernetes
(``kubernetes-local`` on a loopback API server) applied into a namespace of its own with
one replica (tests/kubernetes/deployment.py), N sandboxes created through it; then N
clients, each on its own sandbox, call ``print(1+1)`` for a fixed time, each call on the
next replica in turn (round-robin from the client's own offset, so every replica takes
an equal share); the Deployment is scaled to 2, then 3 replicas and the same sandboxes
measured again.  Replicas are reached at their pod IPs, one kept-alive connection pool
per replica.  Each time a replica is added, every sandbox is called on it one after
another: its first call there (the sandbox adopted on demand: labels, the kernel's
Secret, the state file and notebook on the shared volume), a second (cached), and one
on the replica that created it.

Docker: ``serve --workers 1`` then ``--workers 2`` (bench/workers.py's server), the same
load on one URL (the kernel hands connections to the workers; ``--spread sticky``: each
client on a connection of its own to worker ``i % N``), and bench/workers.py's creator /
first / later call elsewhere probes.

While each load runs, the CPU used (cores) is read from the cgroups (cgroup v1
cpuacct): the sandbox pods or containers, the server pods (on Docker: the server's
processes), this client, and the whole machine (/proc/stat).  Everything the run makes
is removed: the namespace, its PersistentVolume, the shared directory on the node, the
Docker sandboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import httpx2  # noqa: E402
from server import KEY, pct, start_server  # noqa: E402
from workers import elsewhere, free_port  # noqa: E402

from kernel_sandbox.server.restart import remove_leftovers  # noqa: E402
from kernel_sandbox.server.workers import WORKER_HEADER  # noqa: E402

CODE = {"code": "print(1+1)"}
#: The server's limits, above the clients (the defaults: 64 sandboxes, 16 per key).
LIMITS = ("--max-sandboxes", "120", "--max-sandboxes-per-key", "120",
          "--max-calls-per-key", "400")  # fmt: skip
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


# -- CPU ------------------------------------------------------------------------------


def _cgroup_ns(path: Path) -> int:
    try:
        return int((path / "cpuacct.usage").read_text())
    except OSError:
        return 0


def _pod_cgroup(uid: str) -> Path | None:
    for qos in ("", "burstable/", "besteffort/"):
        for name in (f"pod{uid}", f"pod{uid.replace('-', '_')}"):
            path = CPUACCT / "kubepods" / f"{qos}{name}"
            if path.is_dir():
                return path
    return None


def _machine_busy_s() -> float:
    """Seconds of CPU the whole machine spent busy (all cores), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _process_tree_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (the Docker server's workers)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(times.get(p, 0.0) for p in tree)


class Cpu:
    """Cores used between :meth:`start` and :meth:`stop`, by group (name -> sampler of
    CPU seconds so far)."""

    def __init__(self, groups: dict[str, Callable[[], float]]) -> None:
        self.groups = {"machine": _machine_busy_s, "client": time.process_time, **groups}

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.begin = {name: sample() for name, sample in self.groups.items()}

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        used = {n: (s() - self.begin[n]) / wall for n, s in self.groups.items()}
        used["other"] = used["machine"] - sum(v for n, v in used.items() if n != "machine")
        return {f"{name}_cores": round(value, 3) for name, value in used.items()}


# -- load -----------------------------------------------------------------------------


async def load(
    pools: list[httpx2.AsyncClient],
    sids: list[str],
    seconds: float,
    cpu: Cpu,
    sticky: bool = False,
) -> dict[str, Any]:
    """Each sandbox's client calls ``print(1+1)`` for ``seconds``, each call on the next
    replica (pool) in turn, or (``sticky``) every call on the client's own replica (as a
    Service's ``sessionAffinity: ClientIP`` does): calls/s, p50/p99, calls per replica,
    CPU used."""
    latencies: list[float] = []
    in_window: list[bool] = []  # answered before the deadline (a straggler stretches the wall)
    by_replica: dict[str, int] = {}
    failed: list[str] = []

    async def client(i: int, sid: str) -> None:
        n = i
        while time.perf_counter() < deadline:
            pool = pools[n % len(pools)]
            n += 0 if sticky else 1
            t = time.perf_counter()
            r = await pool.post(f"/v1/sandboxes/{sid}/python", json=CODE)
            took = time.perf_counter() - t
            outputs = r.json().get("outputs") if r.status_code == 200 else None
            if not outputs or outputs[0].get("text") != "2\n":
                failed.append(f"{r.status_code} {r.headers.get(WORKER_HEADER)} {r.text[:300]}")
                continue
            latencies.append(took)
            in_window.append(time.perf_counter() <= deadline)
            who = r.headers.get(WORKER_HEADER, "the server")
            by_replica[who] = by_replica.get(who, 0) + 1

    cpu.start()
    started = time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(*(client(i, sid) for i, sid in enumerate(sids)))
    wall = time.perf_counter() - started
    used = cpu.stop()
    return {
        "clients": len(sids),
        "seconds": round(wall, 2),
        "calls": len(latencies),
        "calls_per_s": len(latencies) / wall,
        "calls_per_s_in_window": sum(in_window) / seconds,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
        "calls_by_answerer": by_replica,
        #: answers other than 200 with "2\n" (not counted above), and the first few
        "wrong": len(failed),
        "wrong_first": failed[:3],
        "cpu": used,
    }


def pool(url: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        base_url=url,
        headers={"X-API-Key": KEY},
        timeout=120,
        limits=httpx2.Limits(max_connections=200, max_keepalive_connections=200),
    )


async def pinned(url: str, n: int, workers: list[str | None]) -> list[httpx2.AsyncClient]:
    """``n`` clients of one kept-alive connection each, client i's on worker
    ``workers[i % len(workers)]`` (new connections until the kernel hands one to it;
    None: one server process, which names no worker)."""
    clients: list[httpx2.AsyncClient] = []
    while len(clients) < n:
        c = httpx2.AsyncClient(
            base_url=url, headers={"X-API-Key": KEY}, timeout=120,
            limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1),
        )  # fmt: skip
        want = workers[len(clients) % len(workers)]
        if (await c.get("/health")).headers.get(WORKER_HEADER) == want:
            clients.append(c)
        else:
            await c.aclose()
    return clients


async def create_sandboxes(c: httpx2.AsyncClient, n: int) -> list[str]:
    gate = asyncio.Semaphore(8)

    async def one() -> str:
        async with gate:
            made = await c.post("/v1/sandboxes", json={})
            assert made.status_code == 200, made.text
            sid = str(made.json()["id"])
            assert (await c.post(f"/v1/sandboxes/{sid}/python", json=CODE)).status_code == 200
            return sid

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def delete_sandboxes(c: httpx2.AsyncClient, sids: list[str]) -> None:
    gate = asyncio.Semaphore(8)

    async def one(sid: str) -> None:
        async with gate:
            await c.delete(f"/v1/sandboxes/{sid}")

    await asyncio.gather(*(one(s) for s in sids))


async def timed(c: httpx2.AsyncClient, sid: str) -> float:
    t = time.perf_counter()
    r = await c.post(f"/v1/sandboxes/{sid}/python", json=CODE)
    took = time.perf_counter() - t
    assert r.status_code == 200, r.text
    return took


async def on_new_replica(
    creator: httpx2.AsyncClient, new: httpx2.AsyncClient, sids: list[str]
) -> dict[str, list[float]]:
    """Every sandbox called on the replica just added, one call at a time: the first
    there, a second (cached), one on the creator."""
    seen: dict[str, list[float]] = {"first": [], "cached": [], "creator": []}
    for sid in sids:
        seen["first"].append(await timed(new, sid))
        seen["cached"].append(await timed(new, sid))
        seen["creator"].append(await timed(creator, sid))
    return seen


def p50s(seen: dict[str, list[float]]) -> dict[str, float]:
    out = {f"{k}_p50_ms": statistics.median(v) * 1000 for k, v in seen.items()}
    out.update({f"{k}_p99_ms": pct(v, 99) for k, v in seen.items()})
    out["first_added_p50_ms"] = out["first_p50_ms"] - out["cached_p50_ms"]
    out["calls"] = len(seen["first"])
    return out


# -- Kubernetes -----------------------------------------------------------------------


def _kubeconfig() -> None:
    if not os.environ.get("KUBECONFIG"):
        cluster = ROOT / "scripts" / "k8s" / "cluster.sh"
        done = subprocess.run([str(cluster), "kubeconfig"], capture_output=True, text=True)
        os.environ["KUBECONFIG"] = done.stdout.strip()


@contextlib.contextmanager
def own_namespace(name: str) -> Iterator[str]:
    from kernel_sandbox.backends.kubernetes.api import kube

    core = kube().core
    core.create_namespace({"metadata": {"name": name, "labels": {"kernel-sandbox-bench": "1"}}})
    try:
        yield name
    finally:
        core.delete_namespace(name, grace_period_seconds=0)


async def kubernetes(args: argparse.Namespace) -> dict[str, Any]:
    """Every ``--turns`` value in turn, each a deployment of its own (A/B in one run)."""
    parts = [await kubernetes_run(args, turns) for turns in args.turns.split(",")]
    return {
        "runs": [run for part in parts for run in part["runs"]],
        "elsewhere": parts[0]["elsewhere"],
        "create_s": [part["create_s"] for part in parts],
    }


async def kubernetes_run(args: argparse.Namespace, turns: str) -> dict[str, Any]:
    """The same sandboxes through 1, 2, 3 replicas of one deployment; ``turns``: its
    ``--keep-notebook-turns`` (on / off; empty: the manifests' own choice)."""
    _kubeconfig()
    from kernel_sandbox.backends.kubernetes.api import kube
    from tests.kubernetes.deployment import APP, deploy, scale

    core = kube().core
    figures: dict[str, Any] = {"runs": [], "elsewhere": {}}
    keep = {"on": ("--keep-notebook-turns",), "off": ("--no-keep-notebook-turns",), "": ()}
    server_args = (*LIMITS, "--idle-timeout", "900", *keep[turns])
    # deploy() and scale() wait with asyncio.run of their own: in a thread here
    stack = contextlib.ExitStack()
    ns = stack.enter_context(own_namespace(f"ks-bench-{os.getpid()}{turns and '-' + turns}"))
    try:
        deployed = await asyncio.to_thread(
            lambda: stack.enter_context(deploy(ns, 1, [KEY], args=server_args))
        )

        def pods_cpu(selector: str) -> Callable[[], float]:
            uids = [
                p.metadata.uid for p in core.list_namespaced_pod(ns, label_selector=selector).items
            ]
            paths = [p for p in map(_pod_cgroup, uids) if p is not None]
            assert paths, f"no cgroups for pods {selector}"
            return lambda: sum(map(_cgroup_ns, paths)) / 1e9

        ((creator_pod, creator_url),) = deployed.urls.items()
        pools = {creator_pod: pool(creator_url)}
        t = time.perf_counter()
        sids = await create_sandboxes(pools[creator_pod], args.clients)
        figures["create_s"] = time.perf_counter() - t
        sandboxes_cpu = pods_cpu("kernel-sandbox=true")
        try:
            for replicas in args.replicas:
                if replicas > len(pools):
                    await asyncio.to_thread(scale, deployed, replicas)
                    for name, url in deployed.urls.items():
                        if name not in pools:
                            pools[name] = pool(url)
                            seen = await on_new_replica(pools[creator_pod], pools[name], sids)
                            figures["elsewhere"][name] = seen
                cpu = Cpu({"sandboxes": sandboxes_cpu, "servers": pods_cpu(APP)})
                sticky = args.spread == "sticky"
                run = await load(list(pools.values())[:replicas], sids, args.seconds, cpu, sticky)
                run["replicas"], run["spread"] = replicas, args.spread
                run["checkout"] = f"turns {turns}" if turns else ""
                run["load_1min"] = os.getloadavg()[0]
                figures["runs"].append(run)
            await delete_sandboxes(pools[creator_pod], sids)
        finally:
            await asyncio.gather(*(p.aclose() for p in pools.values()))
    finally:
        await asyncio.to_thread(stack.close)
    merged: dict[str, list[float]] = {"first": [], "cached": [], "creator": []}
    for seen in figures["elsewhere"].values():
        for k, v in seen.items():
            merged[k] += v
    figures["elsewhere"] = p50s(merged) if merged["first"] else {}
    return figures


# -- Docker ---------------------------------------------------------------------------


def _containers_cpu(name: str) -> Callable[[], float]:
    done = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"label=kernel-sandbox.server={name}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    paths = [CPUACCT / "docker" / cid for cid in done.stdout.split()]
    return lambda: sum(map(_cgroup_ns, paths)) / 1e9


def _profile(server_pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy samples one worker (the first child of the server; the server itself with
    one worker) for ``seconds``, only while it holds the GIL (its Python CPU)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    return subprocess.Popen(
        ["py-spy", "record", "--pid", children[0] if children else str(server_pid),
         "--duration", str(int(seconds)), "--rate", "200", "--nonblocking", "--gil",
         "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def top_frames(raw: Path, n: int = 16) -> list[tuple[str, float]]:
    """The project's functions a py-spy raw profile spent the most samples in (self and
    below, each counted once per sample), as (frame, share of the samples)."""
    total, counts = 0, dict[str, int]()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():  # a sample py-spy could not finish writing
            continue
        total += int(count)
        for frame in set(stack.split(";")):
            counts[frame] = counts.get(frame, 0) + int(count)
    ours = [item for item in counts.items() if "kernel_sandbox/" in item[0]]
    ranked = sorted(ours, key=lambda item: -item[1])
    return [(frame, hits / total) for frame, hits in ranked if hits < 0.9 * total][:n]


async def docker(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"runs": []}
    checkouts = [("old", Path(args.old)), ("new", ROOT)] if args.old else [("", ROOT)]
    for workers in args.workers:
        for label, root in checkouts:
            figures["runs"].append(await docker_run(args, workers, label, root))
    return figures


async def docker_run(
    args: argparse.Namespace, workers: int, label: str, root: Path
) -> dict[str, Any]:
    """One ``serve --workers N`` of the checkout at ``root`` under the load."""
    port, name = free_port(), f"bench-replicas-{os.getpid()}-{workers}{label}"
    proc = start_server(port, name, root, extra=("--workers", str(workers), *LIMITS))
    url = f"http://127.0.0.1:{port}"
    try:
        async with pool(url) as c:
            sids = await create_sandboxes(c, args.clients)
            cpu = Cpu(
                {
                    "sandboxes": _containers_cpu(name),
                    "servers": lambda pid=proc.pid: _process_tree_s(pid),
                }
            )
            raw = HERE / "results" / f"replicas-profile-{name}.txt"
            pools, sticky = [c], args.spread == "sticky"
            if sticky:  # each client on one worker's connection, as a Service's affinity
                kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                pools = await pinned(url, len(sids), [*kids] if kids else [None])
            spy = _profile(proc.pid, args.seconds, raw) if args.profile else None
            run = await load(pools, sids, args.seconds, cpu, sticky=sticky)
            for one in pools if sticky else []:
                await one.aclose()
            run["workers"], run["checkout"], run["spread"] = workers, label, args.spread
            run["load_1min"] = os.getloadavg()[0]
            if spy is not None and spy.wait(60) == 0:
                run["profile"] = {"raw": str(raw.relative_to(ROOT)), "top": top_frames(raw)}
            await delete_sandboxes(c, sids)
        if workers > 1:
            run["elsewhere"] = await elsewhere(url, args.probes)
        return run
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        await remove_leftovers(name)


# -- report ---------------------------------------------------------------------------


def table(figures: dict[str, Any]) -> str:
    rows = [
        "| through | calls/s | ratio | in the window | p50 ms | p99 ms "
        "| cores: sandboxes / servers / client / other | server CPU ms/call | wrong answers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for part, key, label in (
        ("kubernetes", "replicas", "replica"),
        ("docker", "workers", "worker"),
    ):
        runs = figures.get(part, {}).get("runs", [])
        for run in runs:
            c = run["cpu"]
            n = run[key]
            which = run.get("checkout", "")
            # the ratio to the first run of the same checkout (the fewest processes)
            base = next(r for r in runs if r.get("checkout", "") == which)
            rows.append(
                f"| {part}: {n} {label}{'s' if n > 1 else ''}{f' ({which})' if which else ''} | "
                f"{run['calls_per_s']:.0f} | {run['calls_per_s'] / base['calls_per_s']:.2f}x | "
                f"{run.get('calls_per_s_in_window', 0):.0f} | {run['p50_ms']:.0f} | "
                f"{run['p99_ms']:.0f} | {c['sandboxes_cores']:.2f} / {c['servers_cores']:.2f} / "
                f"{c['client_cores']:.2f} / {c['other_cores']:.2f} | "
                f"{1000 * c['servers_cores'] / max(run['calls_per_s'], 1e-9):.1f} | "
                f"{run['wrong']} |"
            )
    out = ["\n".join(rows)]
    seen = figures.get("kubernetes", {}).get("elsewhere")
    if seen:
        out.append(
            f"kubernetes, one call at a time ({seen['calls']} sandboxes x each added replica): "
            f"on the creating replica p50 {seen['creator_p50_ms']:.1f} ms, first call on another "
            f"{seen['first_p50_ms']:.1f} ms (p99 {seen['first_p99_ms']:.1f}), then cached "
            f"{seen['cached_p50_ms']:.1f} ms: +{seen['first_added_p50_ms']:.1f} ms once"
        )
    for run in figures.get("docker", {}).get("runs", []):
        if "elsewhere" in run:
            e = run["elsewhere"]
            which = f" ({run['checkout']})" if run.get("checkout") else ""
            out.append(
                f"docker --workers {run['workers']}{which}, a new connection per call "
                f"({e['probes']} probes): creator p50 {e['creator_p50_ms']:.1f} ms, "
                f"first call elsewhere {e['first_elsewhere_p50_ms']:.1f} ms, "
                f"later {e['later_elsewhere_p50_ms']:.1f} ms: "
                f"+{e['first_elsewhere_added_ms']:.1f} ms once"
            )
    for run in figures.get("docker", {}).get("runs", []):
        if "profile" in run:
            top = "\n".join(f"  {share:5.1%}  {frame}" for frame, share in run["profile"]["top"])
            which = f" ({run['checkout']})" if run.get("checkout") else ""
            out.append(f"py-spy, one of --workers {run['workers']}{which}:\n{top}")
    return "\n\n".join(out)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"cpus": os.cpu_count(), "clients": args.clients}
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    path = out / f"replicas-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for part, measure in (("kubernetes", kubernetes), ("docker", docker)):
        if part in args.parts.split(","):
            figures[part] = await measure(args)
            path.write_text(json.dumps(figures, indent=2))  # each part as soon as it is done
    print(f"written: {path.relative_to(ROOT)}")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--parts", default="kubernetes,docker")
    parser.add_argument(
        "--spread",
        choices=["round-robin", "sticky"],
        default="round-robin",
        help="each client's calls over the replicas in turn (Docker: over the connections "
        "the kernel hands to any worker), or all on one replica or worker (the client's "
        "own, as sessionAffinity: ClientIP)",
    )
    parser.add_argument(
        "--turns",
        default="",
        help="Kubernetes part: the replicas' --keep-notebook-turns, 'on', 'off' or 'off,on' "
        "(A/B: a deployment each, one after the other); default: as the manifests say",
    )
    parser.add_argument(
        "--old", help="Docker part: also serve from this checkout, turn about with this one"
    )
    parser.add_argument(
        "--profile", action="store_true", help="Docker part: py-spy one worker under the load"
    )
    figures = asyncio.run(main(parser.parse_args()))
    print(table(figures))
