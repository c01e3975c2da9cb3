"""Where snapshots live: :class:`SnapshotStore`, a local directory by default.

A store keeps, per snapshot id, its record (:class:`~.model.Snapshot`) and its parts:
``state`` (the opaque blob the sandbox wrote) and, when a server recorded the session,
``notebook``.  The store never looks inside a part.  :class:`LocalSnapshotStore` keeps
them in a directory (``$KERNEL_SANDBOX_SNAPSHOTS``, else
``~/.local/share/kernel-sandbox/snapshots``), one folder per snapshot, written under a
temporary name and renamed once whole, so a crash never leaves a half snapshot that
looks whole.  Other stores (an object store, a database) implement the same abstract
methods.  :meth:`SnapshotStore.scoped` gives the view of one owner: a server hands each
key only its own snapshots.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from ..errors import SnapshotError, SnapshotNotFoundError
from .model import Snapshot

__all__ = [
    "SNAPSHOTS_ENV",
    "BlobWriter",
    "LocalSnapshotStore",
    "SnapshotStore",
    "default_store",
    "read_checked",
]

#: Environment variable naming the directory of the default store.
SNAPSHOTS_ENV = "KERNEL_SANDBOX_SNAPSHOTS"
#: Parts a snapshot may have.
PARTS = ("state", "notebook", "connection")
_ID = re.compile(r"^snap-[0-9a-f]{16}$")
_CHUNK = 1 << 20


def check_id(snapshot_id: str) -> str:
    """``snapshot_id`` if it is one this package makes, else SnapshotNotFoundError (so a
    crafted id never becomes a path)."""
    if not isinstance(snapshot_id, str) or not _ID.match(snapshot_id):
        raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r}: not a snapshot id")
    return snapshot_id


class BlobWriter(abc.ABC):
    """One part being written: chunks, then :meth:`commit` (or :meth:`abort`)."""

    @abc.abstractmethod
    async def write(self, chunk: bytes) -> None:
        """Append a chunk."""

    @abc.abstractmethod
    async def commit(self) -> None:
        """The part is whole: keep it."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Drop what was written; safe after commit (does nothing then)."""


class SnapshotStore(abc.ABC):
    """Snapshots' records and parts, by id.  Subclass for another place to keep them."""

    #: The owner this view is limited to (None: every owner's; see :meth:`scoped`).
    owner: str | None = None

    @abc.abstractmethod
    async def writer(self, snapshot_id: str, part: str) -> BlobWriter:
        """A writer for one part of a snapshot not yet :meth:`put`."""

    @abc.abstractmethod
    def read(self, snapshot_id: str, part: str) -> AsyncIterator[bytes]:
        """The part's bytes, a chunk at a time (SnapshotNotFoundError if missing)."""

    @abc.abstractmethod
    async def put(self, snapshot: Snapshot) -> None:
        """Store the record once its parts are committed: the snapshot now exists."""

    @abc.abstractmethod
    async def get(self, snapshot_id: str) -> Snapshot:
        """The record (SnapshotNotFoundError when there is none, or not this owner's)."""

    @abc.abstractmethod
    async def list(self) -> list[Snapshot]:
        """Every record (of this owner), oldest first."""

    @abc.abstractmethod
    async def delete(self, snapshot_id: str) -> None:
        """Remove a snapshot and its parts (SnapshotNotFoundError if unknown)."""

    async def paused(self, sandbox_id: str) -> Snapshot:
        """The snapshot a pause of ``sandbox_id`` made (SnapshotNotFoundError if none)."""
        found = [s for s in await self.list() if s.paused == sandbox_id]
        if not found:
            raise SnapshotNotFoundError(f"no paused sandbox {sandbox_id!r} is in the store")
        return found[-1]

    async def prune(
        self, *, keep: int | None = None, older_than: float | None = None
    ) -> builtins.list[str]:
        """Retention: delete snapshots beyond the newest ``keep``, and those older than
        ``older_than`` seconds; pause snapshots are kept (they *are* a sandbox).  The
        ids deleted."""
        snaps = [s for s in await self.list() if s.paused is None]
        doomed: builtins.list[Snapshot] = []
        if keep is not None:
            doomed += snaps[: max(0, len(snaps) - keep)]
        if older_than is not None:
            cutoff = time.time() - older_than
            doomed += [s for s in snaps if s.created < cutoff and s not in doomed]
        for snap in doomed:
            with contextlib.suppress(SnapshotNotFoundError):
                await self.delete(snap.id)
        return [s.id for s in doomed]

    def scoped(self, owner: str) -> SnapshotStore:
        """This store as ``owner`` sees it: only its snapshots, new ones stamped with it."""
        return _Scoped(self, owner)


class _Scoped(SnapshotStore):
    """One owner's view of a store (what a server hands each key)."""

    def __init__(self, inner: SnapshotStore, owner: str) -> None:
        self._inner = inner
        self.owner = owner

    async def _mine(self, snapshot_id: str) -> Snapshot:
        snap = await self._inner.get(snapshot_id)
        if snap.owner != self.owner:  # the same answer as for no snapshot at all
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r}")
        return snap

    async def writer(self, snapshot_id: str, part: str) -> BlobWriter:
        return await self._inner.writer(snapshot_id, part)

    async def read(self, snapshot_id: str, part: str) -> AsyncIterator[bytes]:
        await self._mine(snapshot_id)
        async for chunk in self._inner.read(snapshot_id, part):
            yield chunk

    async def put(self, snapshot: Snapshot) -> None:
        if snapshot.owner != self.owner:
            raise SnapshotError(f"snapshot {snapshot.id} belongs to another owner")
        await self._inner.put(snapshot)

    async def get(self, snapshot_id: str) -> Snapshot:
        return await self._mine(snapshot_id)

    async def list(self) -> list[Snapshot]:
        return [s for s in await self._inner.list() if s.owner == self.owner]

    async def delete(self, snapshot_id: str) -> None:
        await self._mine(snapshot_id)
        await self._inner.delete(snapshot_id)

    def scoped(self, owner: str) -> SnapshotStore:
        return self._inner.scoped(owner)


class _FileWriter(BlobWriter):
    def __init__(self, path: Path) -> None:
        self._path = path
        self._temp = path.with_name(f".{path.name}.part")
        self._handle = self._temp.open("wb")

    async def write(self, chunk: bytes) -> None:
        await asyncio.to_thread(self._handle.write, chunk)

    async def commit(self) -> None:
        handle = self._handle
        await asyncio.to_thread(handle.flush)
        await asyncio.to_thread(os.fsync, handle.fileno())
        handle.close()
        os.replace(self._temp, self._path)

    async def abort(self) -> None:
        self._handle.close()
        self._temp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the snapshot's folder, if nothing else is in it
            self._path.parent.rmdir()


class LocalSnapshotStore(SnapshotStore):
    """Snapshots in a local directory: ``<root>/<id>/{snapshot.json,state,notebook,connection}``.

    The directory is made private (0700): snapshots hold everything a session held.
    """

    RECORD: ClassVar[str] = "snapshot.json"

    def __init__(self, root: str | Path | None = None) -> None:
        default = Path.home() / ".local" / "share" / "kernel-sandbox" / "snapshots"
        self.root = Path(root or os.environ.get(SNAPSHOTS_ENV) or default)
        self.root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.root, 0o700)

    def _dir(self, snapshot_id: str) -> Path:
        return self.root / check_id(snapshot_id)

    async def writer(self, snapshot_id: str, part: str) -> BlobWriter:
        if part not in PARTS:
            raise SnapshotError(f"a snapshot has no part {part!r}; parts are {PARTS}")
        folder = self._dir(snapshot_id)
        folder.mkdir(mode=0o700, exist_ok=True)
        return _FileWriter(folder / part)

    async def read(self, snapshot_id: str, part: str) -> AsyncIterator[bytes]:
        path = self._dir(snapshot_id) / part
        if part not in PARTS or not path.is_file():
            raise SnapshotNotFoundError(f"snapshot {snapshot_id} has no {part} part")
        with path.open("rb") as handle:
            while chunk := await asyncio.to_thread(handle.read, _CHUNK):
                yield chunk

    async def put(self, snapshot: Snapshot) -> None:
        folder = self._dir(snapshot.id)
        folder.mkdir(mode=0o700, exist_ok=True)
        temp = folder / f".{self.RECORD}.part"
        temp.write_text(json.dumps(snapshot.to_json()))
        os.replace(temp, folder / self.RECORD)

    async def get(self, snapshot_id: str) -> Snapshot:
        path = self._dir(snapshot_id) / self.RECORD
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r}") from None
        except (OSError, ValueError) as exc:
            raise SnapshotError(f"snapshot {snapshot_id}: its record is unreadable: {exc}") from exc
        return Snapshot.from_json(data)

    async def list(self) -> list[Snapshot]:
        found = []
        for folder in self.root.iterdir():
            if _ID.match(folder.name) and (folder / self.RECORD).is_file():
                with contextlib.suppress(SnapshotError):
                    found.append(await self.get(folder.name))
        return sorted(found, key=lambda s: s.created)

    async def delete(self, snapshot_id: str) -> None:
        folder = self._dir(snapshot_id)
        if not (folder / self.RECORD).is_file():
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r}")
        (folder / self.RECORD).unlink()  # first: a half-deleted snapshot does not exist
        await asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<LocalSnapshotStore {self.root}>"


async def read_checked(store: SnapshotStore, snap: Snapshot) -> AsyncIterator[bytes]:
    """The blob's chunks; the last one is held back until the digest and size match."""
    digest = hashlib.sha256()
    size = 0
    held: bytes | None = None
    async for chunk in store.read(snap.id, "state"):
        size += len(chunk)
        digest.update(chunk)
        if size > snap.sizes.get("bytes", 0):
            raise SnapshotError(f"snapshot {snap.id} is larger than its record says")
        if held is not None:
            yield held
        held = chunk
    if digest.hexdigest() != snap.digest or size != snap.sizes.get("bytes"):
        raise SnapshotError(
            f"snapshot {snap.id} does not match its digest: the stored blob was changed "
            "or is damaged; it was not restored"
        )
    if held is not None:
        yield held


def default_store() -> SnapshotStore:
    """The store used when none is given: a :class:`LocalSnapshotStore` at
    ``$KERNEL_SANDBOX_SNAPSHOTS`` (else ``~/.local/share/kernel-sandbox/snapshots``)."""
    return LocalSnapshotStore()
