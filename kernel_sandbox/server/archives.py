"""Tar uploads (``POST /sandbox/{id}/archive``): checked whole before anything is written.

The body's cap (``max_upload_bytes``) counts compressed bytes, but what costs the
server is what comes out: a 0.19 MiB gzip tar held a 200 MiB file (the server grew by
213 MB), and 300 empty members took a minute.  So the archive is read twice, each time
bounded: first its headers only, in stream mode, stopping at the first member past
the caps, where the cost of a member is its size plus
:data:`~kernel_sandbox.limits.ARCHIVE_MEMBER_COST_BYTES` and at most
:data:`~kernel_sandbox.limits.ARCHIVE_MAX_MEMBERS` members are taken; a member past
the cap is never decompressed.  Then, all checked, the members are written one by one
as the sandbox user, each streamed from the archive in chunks as it is written (the
server holds one chunk, never a member).
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
from collections.abc import AsyncIterator
from typing import IO

from ..errors import ConfigError
from ..limits import ARCHIVE_CHUNK_BYTES, ARCHIVE_MAX_MEMBERS, ARCHIVE_MEMBER_COST_BYTES
from ..protocols import SandboxLike

__all__ = ["check_archive", "safe_member", "unpack_archive"]


def safe_member(target: str, name: str) -> str:
    """The path of member ``name`` under ``target``; ConfigError if it points outside."""
    path = posixpath.normpath(posixpath.join(target, name))
    if name.startswith("/") or ".." in name.split("/") or not path.startswith(target):
        raise ConfigError(f"archive member {name!r} points outside {target!r}")
    return path


def check_archive(data: bytes, target: str, max_bytes: int) -> int:
    """Check every member's kind, path and cost (see the module); their count.

    Raises ConfigError (a 400) for a body that is not a tar, a member that is not a
    file or directory or points outside ``target``, and archives past the caps.
    """
    cost = members = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
            for member in tar:
                members += 1
                cost += max(member.size, 0) + ARCHIVE_MEMBER_COST_BYTES
                if members > ARCHIVE_MAX_MEMBERS:
                    raise ConfigError(
                        f"the archive has more than {ARCHIVE_MAX_MEMBERS} members; "
                        "upload fewer (or one larger file)"
                    )
                if cost > max_bytes:
                    raise ConfigError(
                        f"the archive unpacks to more than the server's upload cap of "
                        f"{max_bytes} bytes (each member counts its size plus "
                        f"{ARCHIVE_MEMBER_COST_BYTES} bytes)"
                    )
                safe_member(target, member.name)
                if not (member.isdir() or member.isfile()):
                    raise ConfigError(f"archive member {member.name!r} is not a file or directory")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"the body is not a tar archive: {exc}") from None
    return members


async def _chunks(blob: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(blob.read, ARCHIVE_CHUNK_BYTES):
        yield chunk


async def unpack_archive(data: bytes, sandbox: SandboxLike, target: str, max_bytes: int) -> None:
    """Unpack the tar ``data`` into ``target`` of ``sandbox`` (checked first, see above)."""
    await asyncio.to_thread(check_archive, data, target, max_bytes)
    made: set[str] = set()

    async def mkdir(path: str) -> None:
        if path not in made:
            await sandbox.files.mkdir(path)
            made.add(path)

    await mkdir(target)
    tar = tarfile.open(fileobj=io.BytesIO(data), mode="r|*")  # noqa: SIM115 (closed below)
    try:
        while (member := await asyncio.to_thread(tar.next)) is not None:
            path = safe_member(target, member.name)
            if member.isdir():
                await mkdir(path)
                continue
            await mkdir(posixpath.dirname(path))
            blob = tar.extractfile(member)
            if blob is None or member.size == 0:
                await sandbox.files.write(path, b"")
                continue
            await sandbox.files.write_stream(path, _chunks(blob), max_bytes=max_bytes)
    finally:
        tar.close()
