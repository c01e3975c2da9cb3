"""Exact snapshots: the whole sandbox by its runtime's checkpoint, moved as opaque bytes.

The host asks the sandbox's host to checkpoint it (under gVisor: every process,
thread, open file and in-memory file system of the sandbox, see
:mod:`kernel_sandbox.backends.docker.checkpoints`), then streams the checkpoint's
files into the store as one flat archive (:mod:`.flattar`), counted against the caps
and hashed on the way; the kernel's connection (its key and socket names, which the
restored kernel keeps) goes beside it as the ``connection`` part, never into the
record the server hands out.  A restore streams the archive, checked against its
digest before the last chunk is let through, into a new container's checkpoint
directory and starts the container from it.  Nothing of the checkpoint is read by the
host: it is the runtime's, written by it and read back by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..errors import SnapshotError
from ..kernel.connection import CONTAINER_RUN_DIR, PORT_NAMES, ConnectionInfo
from ..limits import CHECKPOINT_FILES, SNAPSHOT_CONNECTION_BYTES
from .flattar import FlatExtractor, flat_tar
from .model import Snapshot, new_snapshot_id
from .store import SnapshotStore, read_checked

__all__ = ["load_connection", "restore_into", "save_checkpoint"]


async def save_checkpoint(
    store: SnapshotStore,
    base: dict[str, Any],
    files: list[tuple[str, Path]],
    info: ConnectionInfo,
    *,
    max_bytes: int,
    started: float,
) -> Snapshot:
    """Store a checkpoint's ``files`` and the kernel's ``info`` as snapshot of ``base``."""
    if len(files) > CHECKPOINT_FILES:
        raise SnapshotError(
            f"the checkpoint has {len(files)} files, more than {CHECKPOINT_FILES}"
            " (kernel_sandbox.limits.CHECKPOINT_FILES)"
        )
    size = sum(path.stat().st_size for _, path in files)
    if size > max_bytes:
        raise SnapshotError(
            f"the sandbox's checkpoint is {size:,} bytes, larger than {max_bytes:,} (max_bytes;"
            " kernel_sandbox.limits.MAX_SNAPSHOT_BYTES): free memory or files in the sandbox"
        )
    snapshot_id = new_snapshot_id()
    digest, total = hashlib.sha256(), 0
    try:
        writer = await store.writer(snapshot_id, "state")
        try:
            chunks = flat_tar(files)
            while chunk := await asyncio.to_thread(next, chunks, b""):
                total += len(chunk)
                if total > max_bytes + (len(files) + 2) * 1024:
                    raise SnapshotError("the checkpoint grew while it was stored")
                digest.update(chunk)
                await writer.write(chunk)
            await writer.commit()
        except BaseException:
            await writer.abort()
            raise
        connection = await store.writer(snapshot_id, "connection")
        await connection.write(json.dumps(dict(info)).encode())
        await connection.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            await store.delete(snapshot_id)
        raise
    snap = Snapshot(
        id=snapshot_id,
        created=time.time(),
        sizes={
            "bytes": total,
            "entries": len(files),
            "memory_bytes": size,
            "milliseconds": int((time.monotonic() - started) * 1000),
        },
        digest=digest.hexdigest(),
        exact=True,
        **base,
    )
    await store.put(snap)
    return snap


async def load_connection(store: SnapshotStore, snap: Snapshot) -> ConnectionInfo:
    """The kernel's connection saved with ``snap``, checked for its shape."""
    data = b""
    async for chunk in store.read(snap.id, "connection"):
        data += chunk
        if len(data) > SNAPSHOT_CONNECTION_BYTES:
            break
    try:
        info = json.loads(data)
        ok = (
            isinstance(info, dict)
            and info.get("transport") == "ipc"
            and info.get("ip") == f"{CONTAINER_RUN_DIR}/k"
            and all(type(info.get(name)) is int for name in PORT_NAMES)
            and isinstance(info.get("key"), str)
        )
    except ValueError:
        ok = False
    if not ok:
        raise SnapshotError(f"snapshot {snap.id}: its kernel connection is damaged")
    return info  # type: ignore[no-any-return]


def restore_into(store: SnapshotStore, snap: Snapshot) -> Callable[[Path], Awaitable[None]]:
    """What fills a new container's checkpoint directory with ``snap``'s checkpoint."""

    async def fill(target: Path) -> None:
        await asyncio.to_thread(target.mkdir, mode=0o700, parents=True)
        extractor = FlatExtractor(target, CHECKPOINT_FILES)
        try:
            async for chunk in read_checked(store, snap):
                await asyncio.to_thread(extractor.feed, chunk)
            extractor.finish()
        finally:
            extractor.close()

    return fill
