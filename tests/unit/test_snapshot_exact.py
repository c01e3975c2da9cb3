"""An exact snapshot's caps on the host: the checkpoint's files and the kernel's connection.

The checkpoint itself comes from gVisor (its round trips are in the gVisor tier); these
are the bounds the host keeps whatever a checkpoint directory or the store holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernel_sandbox import LocalSnapshotStore, SnapshotError
from kernel_sandbox.kernel.connection import CONTAINER_RUN_DIR, PORT_NAMES
from kernel_sandbox.limits import CHECKPOINT_FILES, SNAPSHOT_CONNECTION_BYTES
from kernel_sandbox.snapshots.exact import load_connection, save_checkpoint
from kernel_sandbox.snapshots.model import new_snapshot_id


async def test_a_checkpoint_of_more_files_than_the_cap_is_refused_and_nothing_stored(
    tmp_path: Path,
) -> None:
    store = LocalSnapshotStore(tmp_path / "snapshots")
    files = []
    for n in range(CHECKPOINT_FILES + 1):
        path = tmp_path / f"part-{n}"
        path.write_bytes(b"x")
        files.append((path.name, path))
    refused = rf"{CHECKPOINT_FILES + 1} files, more than {CHECKPOINT_FILES} .*CHECKPOINT_FILES"
    with pytest.raises(SnapshotError, match=refused):
        await save_checkpoint(store, {}, files, {}, max_bytes=1 << 20, started=time.monotonic())
    assert await store.list() == []
    assert list((tmp_path / "snapshots").iterdir()) == []


async def test_a_kernel_connection_is_read_only_up_to_the_cap(tmp_path: Path) -> None:
    store = LocalSnapshotStore(tmp_path / "snapshots")
    snap = SimpleNamespace(id=new_snapshot_id())
    good = {
        "transport": "ipc",
        "ip": f"{CONTAINER_RUN_DIR}/k",
        "key": "k",
        **{name: n for n, name in enumerate(PORT_NAMES, 1)},
    }
    writer = await store.writer(snap.id, "connection")
    await writer.write(json.dumps(good).encode())
    await writer.commit()
    assert await load_connection(store, snap) == good

    # a valid connection behind 32 MiB of whitespace: whole, it would parse
    writer = await store.writer(snap.id, "connection")
    await writer.write(b" " * (32 << 20) + json.dumps(good).encode())
    await writer.commit()
    read = 0
    stock = store.read

    async def counted(snapshot_id: str, part: str) -> AsyncIterator[bytes]:
        nonlocal read
        async for chunk in stock(snapshot_id, part):
            read += len(chunk)
            yield chunk

    store.read = counted
    with pytest.raises(SnapshotError, match="its kernel connection is damaged"):
        await load_connection(store, snap)
    assert (
        SNAPSHOT_CONNECTION_BYTES < read <= SNAPSHOT_CONNECTION_BYTES + (1 << 20)
    )  # one chunk more
