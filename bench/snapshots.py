"""Durable sessions: pause and resume time by session size, fork x4, memory freed.

    PYTHONPATH=$PWD python bench/snapshots.py                 # ~1 MB and ~100 MB
    PYTHONPATH=$PWD python bench/snapshots.py --sizes 1 100 1000 --memory 3g
    PYTHONPATH=$PWD python bench/snapshots.py --kinds exact  # only gVisor's checkpoints

Each session holds one numpy array of the given size (plus the kernel's own state) on
the ``kernel-sandbox:datascience`` image, in each kind of the same run: ``portable``
(the engine's default runtime), ``portable-runsc`` (the same under gVisor) and
``exact`` (under gVisor, ``exact_snapshots=True``: the whole memory by the runtime's
checkpoint; needs an engine that allows checkpoints, and root).  ``pause`` is the wall
time of ``sb.pause()`` (snapshot into a local store, container removed), ``resume``
that of ``AsyncSandbox.resume(id)`` (new container, state back, same id), ``fork x4``
that of ``sb.fork(4)``; ``freed`` is the container's memory use (the engine's cgroup
figure) just before the pause: what a paused sandbox stops costing (a paused sandbox
holds disk only, ``blob`` bytes).  Printed as a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import docker

from kernel_sandbox import AsyncSandbox, LocalSnapshotStore

LABELS = {"kernel-sandbox.bench": "1"}


def _memory(container_id: str | None) -> int:
    if container_id is None:
        return 0
    stats = docker.from_env().containers.get(container_id).stats(stream=False)
    return int(stats.get("memory_stats", {}).get("usage", 0))


KINDS = {
    "portable": {},
    "portable-runsc": {"runtime": "runsc"},
    "exact": {"runtime": "runsc", "exact_snapshots": True},
}


async def one(
    size_mb: int, kind: str, image: str, memory: str, store: LocalSnapshotStore
) -> dict[str, float | str]:
    """Seconds (and bytes) for one session of ``size_mb`` MB."""
    sb = await AsyncSandbox.create(
        image=image, memory_limit=memory, labels=LABELS, timeout=600, **KINDS[kind]
    )
    code = f"import numpy as np\ndata = np.random.default_rng(1).random({size_mb * 131072})"
    assert (await sb.run_python(code)).status == "ok"
    row: dict[str, float | str] = {"kind": kind, "MB": size_mb}

    started = time.monotonic()
    forks = await sb.fork(4, store=store)
    row["fork x4 s"] = time.monotonic() - started
    await asyncio.gather(*(f.close() for f in forks))

    row["freed MB"] = _memory(sb.container_id) / 1024**2
    started = time.monotonic()
    snap = await sb.pause(store=store)
    row["pause s"] = time.monotonic() - started
    row["blob MB"] = snap.sizes["bytes"] / 1024**2

    started = time.monotonic()
    back = await AsyncSandbox.resume(sb.id, store=store, labels=LABELS)
    row["resume s"] = time.monotonic() - started
    check = await back.run_python("float(data.sum())")
    assert check.status == "ok", check.text
    await back.close()
    for leftover in await store.list():
        await store.delete(leftover.id)
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 100], help="MB per session")
    parser.add_argument("--image", default="kernel-sandbox:datascience")
    parser.add_argument("--memory", default="1g", help="memory_limit of each sandbox")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        store = LocalSnapshotStore(root)
        rows = [
            await one(size, kind, args.image, args.memory, store)
            for size in args.sizes
            for kind in args.kinds
        ]
    columns = list(rows[0])
    print(" | ".join(f"{c:>14}" for c in columns))
    for row in rows:
        print(
            " | ".join(f"{v:>14.2f}" if isinstance(v, float) else f"{v:>14}" for v in row.values())
        )


if __name__ == "__main__":
    asyncio.run(main())
