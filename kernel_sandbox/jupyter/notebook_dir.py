"""Where the notebook is: the sandbox's view of the folder a Jupyter client names.

A stock kernel starts in the notebook's folder (``cwd`` from jupyter_client: nbclient,
nbconvert, papermill and jupyter_server all pass it), so ``open('data.csv')`` finds the
file beside the notebook.  A sandboxed kernel starts in its working directory, and
``cwd_mode`` (kernelspec: ``kernel-sandbox kernelspec install --cwd-mode``) says what it
holds:

``copy`` (default)
    A copy of the folder, made when the sandbox starts: the kernel reads the files
    beside the notebook and writes what it likes, and nothing it writes reaches the
    host.  Bounded: at most :data:`~kernel_sandbox.limits.CWD_COPY_MAX_FILES` entries
    and :data:`~kernel_sandbox.limits.CWD_COPY_MAX_BYTES` (and the working directory's
    share of ``disk_limit``); a larger folder is not copied at all (the kernel starts in
    an empty directory; the client's log says why).  Links are copied as links, never
    followed, so a link to a file outside the folder brings nothing of it in; files
    that are neither regular files, folders nor links are left out.
``mount``
    The folder itself, read-only, as the working directory (Docker host only): always
    current and never copied, but the kernel cannot write there (``/tmp`` and ``$HOME``
    stay writable).  The root folder is never mounted.
``none``
    Nothing of the host: the kernel starts in an empty working directory.

A client that names no ``cwd`` gets ``none`` whatever the mode: the folder a client
happens to run in is not the notebook's.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Literal

from ..limits import CWD_COPY_MAX_BYTES, CWD_COPY_MAX_FILES

__all__ = ["CWD_MODES", "CwdMode", "FolderTooLarge", "folder_archive", "mount_volume"]

CwdMode = Literal["copy", "mount", "none"]
#: The values of ``cwd_mode``.
CWD_MODES: tuple[CwdMode, ...] = ("copy", "mount", "none")


class FolderTooLarge(ValueError):
    """The folder has more entries or bytes than a copy may take (the message says which)."""


def _read_regular(path: str, size: int) -> bytes | None:
    """The bytes of a regular file, opened without following a link; None if it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(size + 1)[:size]  # the size seen when it was listed, at most


def folder_archive(
    folder: str | os.PathLike[str],
    *,
    max_files: int = CWD_COPY_MAX_FILES,
    max_bytes: int = CWD_COPY_MAX_BYTES,
) -> bytes:
    """A tar of ``folder``'s contents (paths relative to it), links kept as links.

    Raises :class:`FolderTooLarge` as soon as the folder has more than ``max_files``
    entries or ``max_bytes`` of file data, before reading what is past the bound.
    """
    root = os.fspath(folder)
    members: list[tuple[str, os.stat_result]] = []
    total = 0
    for here, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            full = os.path.join(here, name)
            try:
                info = os.lstat(full)
            except OSError:
                continue
            kind = stat.S_IFMT(info.st_mode)
            if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                continue
            members.append((full, info))
            if len(members) > max_files:
                raise FolderTooLarge(f"{root} has more than {max_files} files and folders")
            if kind == stat.S_IFREG:
                total += info.st_size
                if total > max_bytes:
                    raise FolderTooLarge(f"{root} holds more than {max_bytes:,} bytes")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for full, info in members:
            entry = tarfile.TarInfo(os.path.relpath(full, root))
            entry.mtime = int(info.st_mtime)
            entry.mode = stat.S_IMODE(info.st_mode) & 0o755 | 0o600
            if stat.S_ISDIR(info.st_mode):
                entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(entry)
            elif stat.S_ISLNK(info.st_mode):
                try:
                    entry.linkname = os.readlink(full)
                except OSError:
                    continue
                entry.type = tarfile.SYMTYPE
                tar.addfile(entry)
            else:
                data = _read_regular(full, info.st_size)
                if data is None:
                    continue
                entry.size = len(data)
                tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def mount_volume(folder: str | os.PathLike[str], working_dir: str) -> dict[str, dict[str, str]]:
    """The read-only bind of ``folder`` on the working directory (``volumes`` form)."""
    real = Path(folder).resolve()
    if real == Path(real.anchor) or not real.is_dir():
        raise ValueError(f"{folder} is not a folder that may be mounted (the root never is)")
    return {str(real): {"bind": working_dir, "mode": "ro"}}
