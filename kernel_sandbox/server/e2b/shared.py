"""E2B records on the shared record directory, so that any worker or replica serves them.

With several server processes (``serve --workers N``, ``--replica``; see
:mod:`kernel_sandbox.server.replicas`) a client's E2B calls land on any of them.  What E2B's
API adds to a sandbox (its template, metadata, environment, timeout, paused flag and envd
access token: :data:`SHARED_FIELDS`) is therefore kept in one JSON file per sandbox::

    <record dir>/.e2b/<sandbox id>.json     (0600, in a 0700 directory)

written whole (a temporary file renamed over it) whenever it changes, and read again by
every process at each call into the sandbox (a process keeps its copy while the file's
``stat`` is unchanged).  A file gone means the sandbox was killed elsewhere.  What
lives in one process stays there: running commands and watchers (their streams are that
process's), metrics samples and the code interpreter's extra contexts (kernels the
process started).  The file is the server's own, never a tenant's path; it is still
read to at most :data:`~kernel_sandbox.limits.E2B_RECORD_BYTES`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...limits import E2B_RECORD_BYTES

__all__ = ["RECORDS_DIR", "SHARED_FIELDS", "RecordStore", "Stamp"]

log = logging.getLogger(__name__)

#: The records' directory in the record directory (no key id starts with a dot).
RECORDS_DIR = ".e2b"
#: The fields of :class:`.state.E2bSandbox` every process shares.
SHARED_FIELDS = (
    "id",
    "owner",
    "template",
    "metadata",
    "envs",
    "cpu_count",
    "memory_mb",
    "disk_mb",
    "end_at",
    "on_timeout",
    "paused",
    "access_token",
    "started_at",
)
_SUFFIX = ".json"
_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
#: What tells a record file's versions apart: (inode, size, mtime in ns).
Stamp = tuple[int, int, int]


class RecordStore:
    """The E2B records of every process sharing one record directory."""

    def __init__(self, record_dir: Path) -> None:
        self.root = record_dir / RECORDS_DIR

    def _path(self, sandbox_id: str) -> Path | None:
        return self.root / f"{sandbox_id}{_SUFFIX}" if _ID.fullmatch(sandbox_id) else None

    def save(self, fields: dict[str, Any]) -> Stamp:
        """Write a record whole (its ``id`` names the file); the stamp of the file written.
        A record over :data:`E2B_RECORD_BYTES` is refused with a :class:`ConfigError`."""
        path = self._path(str(fields["id"]))
        if path is None:
            raise ConfigError(f"sandbox id {fields['id']!r} cannot name an E2B record")
        data = json.dumps(fields, separators=(",", ":")).encode()
        if len(data) > E2B_RECORD_BYTES:
            raise ConfigError(
                f"the sandbox's E2B record (metadata and envVars) is {len(data)} bytes: "
                f"at most {E2B_RECORD_BYTES} are kept"
            )
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=".", suffix=".tmp")  # 0600
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                written = _stamp(os.fstat(out.fileno()))
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return written

    def load(self, sandbox_id: str) -> tuple[Stamp, dict[str, Any]] | None:
        """A record and the stamp of the file it came from; None when there is none
        (or it cannot be read: logged)."""
        path = self._path(sandbox_id)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            data = file.read(E2B_RECORD_BYTES + 1)
        stamp = _stamp(info)
        try:
            if len(data) > E2B_RECORD_BYTES:
                raise ValueError(f"over {E2B_RECORD_BYTES} bytes")
            fields = json.loads(data)
            if not isinstance(fields, dict) or fields.get("id") != sandbox_id:
                raise ValueError("not this sandbox's record")
            missing = [name for name in SHARED_FIELDS if name not in fields]
            if missing:  # another version's record, say
                raise ValueError(f"no {', '.join(missing)}")
        except ValueError as exc:
            log.warning("ignoring the E2B record %s: %s", path, exc)
            return None
        return stamp, {name: fields[name] for name in SHARED_FIELDS}

    def stamp(self, sandbox_id: str) -> Stamp | None:
        """The stamp of a record's file as it is now (None: no file)."""
        path = self._path(sandbox_id)
        try:
            info = os.stat(path, follow_symlinks=False) if path is not None else None
        except OSError:
            return None
        return None if info is None else _stamp(info)

    def remove(self, sandbox_id: str) -> None:
        """Forget a record (gone already: nothing to do)."""
        path = self._path(sandbox_id)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def ids(self) -> list[str]:
        """The ids of every record kept."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        found = (name.removesuffix(_SUFFIX) for name in names if name.endswith(_SUFFIX))
        return [sid for sid in found if _ID.fullmatch(sid)]


def _stamp(info: os.stat_result) -> Stamp:
    return (info.st_ino, info.st_size, info.st_mtime_ns)
