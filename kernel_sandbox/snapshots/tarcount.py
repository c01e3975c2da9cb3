"""Count the members of a tar stream as it passes, without interpreting it.

A snapshot blob comes from a sandbox: the host stores it as opaque bytes, but its cap
on entries (:data:`~kernel_sandbox.limits.MAX_SNAPSHOT_FILES`) must hold however the
kernel lies.  :class:`TarCounter` walks the 512-byte header blocks (reading only each
header's size field, to skip the data), keeps one partial block at most, and refuses a
stream that is not tar.  Python's ``tarfile`` is not used here: it reads a PAX header's
whole body into memory, which a crafted stream could make as large as the blob.
"""

from __future__ import annotations

from ..errors import SnapshotError

__all__ = ["TarCounter"]

_BLOCK = 512
#: Header types that describe the next member rather than being one (PAX, GNU long names).
_META_TYPES = frozenset(b"xgLK")


class TarCounter:
    """Feed chunks; :attr:`entries` counts members, past ``max_entries`` it raises."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries = 0
        self._partial = b""
        self._skip = 0  # data bytes (whole blocks) of the current member still to pass
        self._ended = False

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of the stream."""
        view = memoryview(chunk)
        while view:
            if self._ended:
                return  # the end marker was seen: what follows is padding
            if self._skip:
                step = min(self._skip, len(view))
                self._skip -= step
                view = view[step:]
                continue
            need = _BLOCK - len(self._partial)
            self._partial += bytes(view[:need])
            view = view[need:]
            if len(self._partial) == _BLOCK:
                self._header(self._partial)
                self._partial = b""

    def _header(self, block: bytes) -> None:
        if block == bytes(_BLOCK):
            self._ended = True
            return
        size = _size(block[124:136])
        self._skip = -(-size // _BLOCK) * _BLOCK
        if block[156] not in _META_TYPES:
            self.entries += 1
            if self.entries > self.max_entries:
                raise SnapshotError(
                    f"the snapshot has more than {self.max_entries:,} entries (files and "
                    "variables; kernel_sandbox.limits.MAX_SNAPSHOT_FILES): delete files in "
                    "the sandbox or leave /tmp out"
                )

    def finish(self) -> None:
        """The stream ended: it must have ended whole."""
        if not self._ended or self._skip:
            raise SnapshotError("the snapshot stream ended early (not a whole tar archive)")


def _size(field: bytes) -> int:
    """A tar size field: octal digits, or base-256 when the high bit is set."""
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        raise SnapshotError("the snapshot stream is not a tar archive") from None
