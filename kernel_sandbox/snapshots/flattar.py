"""A flat archive: regular files under plain names, written and read as a tar stream.

What an exact snapshot holds is a directory the OCI runtime wrote on the host (the
checkpoint of the sandbox's memory) and the host's own note of the kernel's
connection: files, no directories, no links.  :func:`flat_tar` streams them as an
ordinary ustar archive (``tar -t`` lists it); :class:`FlatExtractor` writes such a
stream back into a new directory as it arrives, holding one header block at most,
and refuses anything else — a member that is not a regular file, a name with a
slash or a dot-dot, more than ``max_entries`` members, a file twice — so a changed
blob cannot make the host write outside that directory or follow a link.
"""

from __future__ import annotations

import os
import re
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import SnapshotError

__all__ = ["FlatExtractor", "flat_tar"]

_BLOCK = 512
_CHUNK = 1 << 20
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")


def flat_tar(files: list[tuple[str, Path]]) -> Iterator[bytes]:
    """The archive of ``files`` (name in the archive, path on this host), in chunks.

    Each path is opened without following links and must be a regular file."""
    for name, path in files:
        if not _NAME.match(name):
            raise SnapshotError(f"{name!r} is not a plain file name")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SnapshotError(f"{path} is not a regular file")
            member = tarfile.TarInfo(name)
            member.size, member.mode, member.mtime = info.st_size, 0o600, int(info.st_mtime)
            yield member.tobuf(format=tarfile.USTAR_FORMAT)
            left = info.st_size
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    raise SnapshotError(f"{path} shrank while it was read")
                left -= len(chunk)
                yield chunk
            if info.st_size % _BLOCK:
                yield bytes(_BLOCK - info.st_size % _BLOCK)
    yield bytes(2 * _BLOCK)


class FlatExtractor:
    """Feed the chunks of a :func:`flat_tar` stream; files appear in ``target``.

    ``target`` must exist and be empty; :meth:`finish` checks the stream ended whole.
    """

    def __init__(self, target: Path, max_entries: int) -> None:
        self.target = target
        self.max_entries = max_entries
        self.names: list[str] = []
        self._partial = b""
        self._left = 0  # data bytes of the current member still to come
        self._pad = 0  # padding bytes after them
        self._out: int | None = None
        self._ended = False

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            if self._ended:
                if any(view):
                    raise SnapshotError("the snapshot has data after its end")
                return
            if self._left:
                step = min(self._left, len(view))
                assert self._out is not None
                os.write(self._out, view[:step])
                self._left -= step
                view = view[step:]
                if not self._left:
                    os.close(self._out)
                    self._out = None
                continue
            if self._pad:
                step = min(self._pad, len(view))
                self._pad -= step
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
        try:
            member = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except (tarfile.HeaderError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"the snapshot is not a flat archive: {exc}") from None
        if not member.isreg() or not _NAME.match(member.name) or member.name in self.names:
            raise SnapshotError(f"the snapshot holds {member.name!r}, which is not expected")
        self.names.append(member.name)
        if len(self.names) > self.max_entries:
            raise SnapshotError(f"the snapshot has more than {self.max_entries} files")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        self._out = os.open(self.target / member.name, flags, 0o600)
        self._left, self._pad = member.size, -member.size % _BLOCK
        if not self._left:
            os.close(self._out)
            self._out = None

    def finish(self) -> None:
        """The stream ended: it must have ended whole."""
        self.close()
        if not self._ended or self._left or self._partial:
            raise SnapshotError("the snapshot stream ended early (not a whole archive)")

    def close(self) -> None:
        if self._out is not None:
            os.close(self._out)
            self._out = None
