"""Files inside a sandbox, moved through the engine's archive API beside the kernel.

Every operation acts with the sandbox user's permissions: writes are checked by a
process running as that user before the archive is extracted, and land owned by it.
Relative paths resolve against the sandbox's working directory.  Binary-safe.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import FileOperationError, SandboxFileNotFoundError
from .results import FileInfo, format_size

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox

__all__ = ["AsyncFiles"]

_TYPES = {"f": "file", "d": "directory", "l": "symlink"}
# Exit statuses of the helper scripts below.
_MISSING, _NOT_DIR, _IS_DIR = 3, 4, 5

_PREPARE_WRITE = (
    'test -d "$1" && exit 5; mkdir -p -- "$(dirname -- "$1")" && touch -- "$1" && id -u && id -g'
)
_LIST = (
    'test -e "$1" || exit 3; test -d "$1" || exit 4; '
    "find \"$1\" -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%f\\0'"
)
_REMOVE = 'test -e "$1" || test -L "$1" || exit 3; rm -rf -- "$1"'


class AsyncFiles:
    """``sandbox.files``: read, write, list and move files in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def _sh(self, script: str, path: str) -> tuple[int, str, str]:
        sb = self._sandbox
        sb._check_open()
        assert sb.container_id is not None
        result = await sb.backend.exec(
            sb.container_id, ["sh", "-c", script, "sh", path], user=sb.config.user
        )
        return (
            result.exit_code,
            result.stdout.decode(errors="replace"),
            result.stderr.decode(errors="replace"),
        )

    def _fail(self, code: int, path: str, stderr: str, action: str) -> FileOperationError:
        if code == _MISSING:
            return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {path}")
        if code == _NOT_DIR:
            return FileOperationError(f"not a directory: {path}")
        if code == _IS_DIR:
            return FileOperationError(f"is a directory, not a file: {path}")
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
        if "read-only file system" in detail.lower():
            detail += (
                " (only the working directory, $HOME, /tmp and the sandbox's volumes are writable)"
            )
        return FileOperationError(f"cannot {action} {path}: {detail}")

    def _full(self, path: str, size: int) -> FileOperationError:
        config = self._sandbox.config
        budget = config.disk_budget()
        places = {"working_dir": config.working_dir, "home": "$HOME", "tmp": "/tmp"}
        split = ", ".join(f"{format_size(budget[k])} for {name}" for k, name in places.items())
        return FileOperationError(
            f"cannot write {path} ({format_size(size)}): the sandbox's writable area is full "
            "(no space left on device). Delete files in the sandbox, or raise disk_limit "
            f"(now {config.disk_limit!r}: {split})"
        )

    async def read(self, path: str) -> bytes:
        """The bytes of a file; one over ``config.max_file_bytes`` is refused, unread."""
        sb = self._sandbox
        sb._check_open()
        full = sb.resolve_path(path)
        assert sb.container_id is not None
        archive = await sb.backend.get_archive(sb.container_id, full, sb.config.max_file_bytes)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.next()
            if member is None:
                raise SandboxFileNotFoundError(f"no such file in the sandbox: {full}")
            if member.isdir():
                raise FileOperationError(f"is a directory, not a file: {full}")
            if member.issym():
                target = posixpath.join(posixpath.dirname(full), member.linkname)
                return await self.read(target)
            handle = tar.extractfile(member)
            if handle is None:
                raise FileOperationError(f"not a regular file: {full}")
            return handle.read()

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file decoded as text."""
        data = await self.read(path)
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise FileOperationError(
                f"{path} is not valid {encoding} text ({exc.reason} at byte {exc.start}); "
                "read it as bytes or give another encoding"
            ) from exc

    async def write(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Create or replace a file (parent directories are created)."""
        payload = data.encode(encoding) if isinstance(data, str) else data
        full = self._sandbox.resolve_path(path)
        code, out, err = await self._sh(_PREPARE_WRITE, full)
        if code != 0:
            raise self._fail(code, full, err, "write")
        uid, gid = (int(x) for x in out.split())
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(full))
            info.size, info.mode, info.uid, info.gid = len(payload), 0o644, uid, gid
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(payload))
        assert self._sandbox.container_id is not None
        try:
            await self._sandbox.backend.put_archive(
                self._sandbox.container_id, posixpath.dirname(full), buffer.getvalue()
            )
        except FileOperationError as exc:
            if "no space left on device" not in str(exc).lower():
                raise
            # The engine leaves the file truncated (and owned by root): remove it, so that
            # the space comes back and no half-written file passes for the real one.
            with contextlib.suppress(FileOperationError):  # the first error is the news
                await self._sh('rm -f -- "$1"', full)
            raise self._full(full, len(payload)) from exc

    async def append(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Add to the end of a file, creating it if needed."""
        payload = data.encode(encoding) if isinstance(data, str) else data
        try:
            existing = await self.read(path)
        except SandboxFileNotFoundError:
            existing = b""
        await self.write(path, existing + payload)

    async def list(self, path: str = ".") -> list[FileInfo]:
        """Entries of a directory, sorted by name."""
        full = self._sandbox.resolve_path(path)
        code, out, err = await self._sh(_LIST, full)
        if code != 0:
            raise self._fail(code, full, err, "list")
        entries = []
        for line in out.split("\0"):  # NUL-terminated: a name may hold a newline
            if not line:
                continue
            kind, size, name = line.split("\t", 2)
            entries.append(FileInfo(name, _TYPES.get(kind, "other"), int(size)))  # type: ignore[arg-type]
        return sorted(entries, key=lambda e: e.name)

    async def exists(self, path: str) -> bool:
        """True when the path exists (file, directory or anything else)."""
        code, _, _ = await self._sh('test -e "$1"', self._sandbox.resolve_path(path))
        return code == 0

    async def remove(self, path: str) -> None:
        """Delete a file, or a directory with everything in it."""
        full = self._sandbox.resolve_path(path)
        code, _, err = await self._sh(_REMOVE, full)
        if code != 0:
            raise self._fail(code, full, err, "remove")

    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents; an existing directory is fine."""
        full = self._sandbox.resolve_path(path)
        code, _, err = await self._sh('mkdir -p -- "$1"', full)
        if code != 0:
            raise self._fail(code, full, err, "create directory")

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a host file into the sandbox."""
        await self.write(remote, Path(local).read_bytes())

    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a sandbox file to the host (parent directories are created)."""
        data = await self.read(remote)
        target = Path(local)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
