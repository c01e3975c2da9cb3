"""File transfer through the engine's archive API, checked as the sandbox user.

A write is first prepared by a process running as the sandbox user (it must be able
to create the file, and its uid/gid go into the archive), then extracted by the
engine; a read fetches a tar archive whose size is bounded before it is read.  A
full writable area leaves no half-written file behind.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import sys
import tarfile
import time

import docker
import docker.errors

from ...errors import FileOperationError, SandboxFileNotFoundError
from ...results import format_size
from .engine import run_in_thread
from .exec import exec_process

__all__ = ["read_file", "write_file"]

#: Room for tar headers and padding on top of ``read_file``'s ``max_bytes``.
_TAR_OVERHEAD = 64 * 1024
#: Links followed by one read before it counts as a loop.
_MAX_LINKS = 40
_IS_DIR = 5
_PREPARE_WRITE = (
    'test -d "$1" && exit 5; mkdir -p -- "$(dirname -- "$1")" && touch -- "$1" && id -u && id -g'
)


async def read_file(
    api: docker.APIClient, container_id: str, path: str, max_bytes: int, _links: int = 0
) -> bytes:
    """The bytes of the file at ``path``; larger than ``max_bytes`` is refused unread."""
    archive = await _get_archive(api, container_id, path, max_bytes)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        if member is None:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path}")
        if member.isdir():
            raise FileOperationError(f"is a directory, not a file: {path}")
        if member.issym():
            if _links >= _MAX_LINKS:
                raise FileOperationError(f"too many levels of symbolic links: {path}")
            target = posixpath.join(posixpath.dirname(path), member.linkname)
            return await read_file(api, container_id, target, max_bytes, _links + 1)
        handle = tar.extractfile(member)
        if handle is None:
            raise FileOperationError(f"not a regular file: {path}")
        return handle.read()


async def write_file(
    api: docker.APIClient, container_id: str, user: str, path: str, data: bytes
) -> None:
    """Create or replace ``path`` with ``data``, owned by the sandbox user."""
    prepared = await exec_process(
        api, container_id, ["sh", "-c", _PREPARE_WRITE, "sh", path], user=user
    )
    if prepared.exit_code == _IS_DIR:
        raise FileOperationError(f"is a directory, not a file: {path}")
    if prepared.exit_code != 0:
        stderr = prepared.stderr.decode(errors="replace").strip()
        detail = stderr.splitlines()[-1] if stderr else f"exit status {prepared.exit_code}"
        if "read-only file system" in detail.lower():
            detail += (
                " (only the working directory, $HOME, /tmp and the sandbox's volumes are writable)"
            )
        raise FileOperationError(f"cannot write {path}: {detail}")
    uid, gid = (int(x) for x in prepared.stdout.split())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(posixpath.basename(path))
        info.size, info.mode, info.uid, info.gid = len(data), 0o644, uid, gid
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    directory = posixpath.dirname(path)
    try:
        await _put_archive(api, container_id, directory, buffer.getvalue())
    except FileOperationError as exc:
        if "no space left on device" not in str(exc).lower():
            raise
        # The engine leaves the file truncated (and owned by root): remove it, so that
        # the space comes back and no half-written file passes for the real one.
        with contextlib.suppress(FileOperationError):  # the first error is the news
            await exec_process(api, container_id, ["rm", "-f", "--", path], user=user)
        raise


async def _put_archive(
    api: docker.APIClient, container_id: str, directory: str, tar_bytes: bytes
) -> None:
    try:
        ok = await run_in_thread(api.put_archive, container_id, directory, tar_bytes)
    except docker.errors.NotFound as exc:
        raise SandboxFileNotFoundError(f"no such directory in the sandbox: {directory}") from exc
    except docker.errors.APIError as exc:
        raise FileOperationError(f"could not write into {directory}: {exc.explanation}") from exc
    if not ok:
        raise FileOperationError(f"the engine refused to write into {directory}")


async def _get_archive(
    api: docker.APIClient, container_id: str, path: str, max_bytes: int | None
) -> bytes:
    def _get() -> bytes:
        stream, stat = api.get_archive(container_id, path)
        # The engine's stat header gives a file's size before any byte is read; the
        # count below also bounds what it does not cover (a directory's content).
        limit = sys.maxsize if max_bytes is None else max_bytes + _TAR_OVERHEAD
        archive = bytearray()
        try:
            if max_bytes is not None and int(stat.get("size") or 0) > max_bytes:
                raise _too_large(path, int(stat["size"]), max_bytes)
            for chunk in stream:
                archive += chunk
                if len(archive) > limit:
                    raise _too_large(path, None, max_bytes or 0)
        finally:
            stream.close()  # drop the rest: the engine stops sending
        return bytes(archive)

    try:
        return await run_in_thread(_get)  # type: ignore[no-any-return]
    except docker.errors.NotFound as exc:
        raise SandboxFileNotFoundError(f"no such file in the sandbox: {path}") from exc
    except docker.errors.APIError as exc:
        raise FileOperationError(f"could not read {path}: {_sandbox_reason(exc)}") from exc


def _too_large(path: str, size: int | None, max_bytes: int) -> FileOperationError:
    what = f"{path} is {format_size(size)}" if size is not None else f"{path} holds more than that"
    return FileOperationError(
        f"{what}; files are read whole into memory and the limit is {format_size(max_bytes)} "
        "(SandboxConfig.max_file_bytes): read a part with the shell (head -c, tail -c, "
        "split) or raise max_file_bytes"
    )


def _sandbox_reason(exc: docker.errors.APIError) -> str:
    """The engine's explanation, without the host paths it names for a link loop.

    A loop of links in the sandbox (``ln -s a b; ln -s b a``) makes the engine answer
    "too many links in /var/lib/docker/overlay2/<layer>/merged/...": the host's storage
    layout, which is none of the sandbox's (or the model's) business.
    """
    explanation = str(exc.explanation or exc)
    if "too many links" in explanation:
        return "too many levels of symbolic links (a link loop?)"
    return explanation
