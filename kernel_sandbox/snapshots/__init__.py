"""Durable sessions: a sandbox's state saved, stored and brought back.

:class:`Snapshot` (the host's record of one saved state), :class:`SnapshotStore` (where
snapshots live; :class:`LocalSnapshotStore` by default), and the portable mechanism
(:mod:`.portable`: made and loaded inside the sandbox, moved as opaque bytes).  The
sandbox's own methods (``snapshot``, ``restore``, ``fork``, ``pause``, ``resume``) are
the API; this package is what they stand on.
"""

from .model import Snapshot
from .portable import Restored
from .store import SNAPSHOTS_ENV, BlobWriter, LocalSnapshotStore, SnapshotStore, default_store

__all__ = [
    "SNAPSHOTS_ENV",
    "BlobWriter",
    "LocalSnapshotStore",
    "Restored",
    "Snapshot",
    "SnapshotStore",
    "default_store",
]
