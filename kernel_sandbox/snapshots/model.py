"""What a snapshot is, as the host knows it: a frozen record beside an opaque blob.

Everything here is written by the host: sizes it counted, the digest it computed, the
settings the sandbox ran with, the owner that asked.  What the kernel reported (the
names it saved, those it could not save and why) is kept as text for the user, checked
for type and bounded; nothing in it is ever acted on.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import SnapshotError
from ..limits import SNAPSHOT_REPORT_TEXT_CHARS

__all__ = ["Snapshot", "new_snapshot_id"]


def new_snapshot_id() -> str:
    """A fresh snapshot id (``snap-`` + 16 hex digits): unguessable, safe as a file name."""
    return "snap-" + secrets.token_hex(8)


@dataclass(frozen=True)
class Snapshot:
    """One saved state of a sandbox: what :meth:`AsyncSandbox.snapshot` returns.

    ``saved`` maps each variable saved to its type and pickled size; ``not_saved`` maps
    each one that was not to the reason (an open file, a socket, a thread, a generator,
    whatever could not be pickled); ``modules`` are re-imported by name on restore.
    ``sizes`` are the host's own counts: ``bytes`` of the stored blob and its
    ``entries`` (files, directories and variables).  ``paused`` names the sandbox id a
    :meth:`AsyncSandbox.pause` made it for (resumed under that id).
    """

    id: str
    created: float
    sandbox_id: str
    image: str
    #: The sandbox's settings (``SandboxConfig.model_dump``), restored unless overridden.
    config: dict[str, Any]
    sizes: dict[str, int]
    #: SHA-256 (hex) of the blob, checked on every restore.
    digest: str
    name: str | None = None
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_saved: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    #: Files the kernel could not read (unreadable, vanished); the rest were saved.
    file_errors: tuple[str, ...] = ()
    #: True for a gVisor checkpoint (the whole memory), False for a portable one.
    exact: bool = False
    #: Who may restore it (a server's key id; "" for a local user).
    owner: str = ""
    paused: str | None = None
    #: The kernel's execution count when it was taken: the cell it follows.
    execution_count: int = 0
    #: The snapshot the source sandbox was restored from, if any (a fork's lineage).
    parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready values (what a store writes, what the server sends)."""
        data = asdict(self)
        data["file_errors"] = list(self.file_errors)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        """Read a record back (a store's file, a server's answer)."""
        try:
            values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
            values["file_errors"] = tuple(values.get("file_errors", ()))
            return cls(**values)
        except (KeyError, TypeError) as exc:
            raise SnapshotError(f"not a snapshot record: {exc}") from exc

    def summary(self) -> str:
        """One line for a person: id, name, size, what was and was not saved."""
        size = self.sizes.get("bytes", 0)
        kind = "exact" if self.exact else "portable"
        label = f" {self.name!r}" if self.name else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
        return (
            f"{self.id}{label} ({kind}, {size:,} bytes, {when}): {len(self.saved)} variables "
            f"saved, {len(self.not_saved)} not saved, {len(self.modules)} modules"
        )


def bounded_report(report: Any) -> dict[str, Any]:
    """The kernel's report, checked for shape and cut to bounded text (never trusted)."""
    if not isinstance(report, dict):
        raise SnapshotError("the kernel's snapshot report is not an object")

    def text(value: Any) -> str:
        return str(value)[:SNAPSHOT_REPORT_TEXT_CHARS]

    def mapping(key: str) -> dict[str, Any]:
        value = report.get(key, {})
        return value if isinstance(value, dict) else {}

    saved = {}
    for name, info in mapping("saved").items():
        info = info if isinstance(info, dict) else {}
        size = info.get("bytes")
        saved[text(name)] = {
            "type": text(info.get("type", "?")),
            "bytes": size if isinstance(size, int) else 0,
        }
    errors = report.get("errors", [])
    count = report.get("execution_count", 0)
    return {
        "saved": saved,
        "not_saved": {text(k): text(v) for k, v in mapping("not_saved").items()},
        "modules": {text(k): text(v) for k, v in mapping("modules").items()},
        "file_errors": tuple(text(e) for e in errors[:100]) if isinstance(errors, list) else (),
        "execution_count": count if isinstance(count, int) else 0,
    }
