"""envd's filesystem calls inside the sandbox: stat, list, mkdir, move, watch.

Run by the host (``kernel_sandbox.server.e2b.filesystem``) beside the kernel, as the
sandbox user, with one JSON argument: ``op``, ``path`` (absolute), ``protected`` (the
host's paths that are never touched, whatever link leads there) and the op's own
fields.  It prints JSON lines on stdout: one entry (``stat``/``mkdir``/``move``), up to
``limit`` + 1 entries (``list``), or events as they happen (``watch``: a ``{}`` line
every few seconds shows the host is still reading; when it is not, the write fails and
this ends).  Refusals exit with a status: 3 no such path, 4 not a directory, 6
protected, 9 already exists, 5 a request the file system refuses (a folder moved into
itself, a name too long, a loop of links, ...), 7 not permitted, 8 no space left, 1
anything else (its message on stderr).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import grp
import json
import os
import pwd
import re
import select
import stat
import struct
import sys

MISSING, NOT_DIR, PROTECTED, EXISTS = 3, 4, 6, 9
REFUSED, DENIED, FULL = 5, 7, 8
#: The file system's answers to what the caller asked, as the statuses above.
CALLERS = {
    errno.EINVAL: REFUSED,
    errno.EISDIR: REFUSED,
    errno.ENOTEMPTY: REFUSED,
    errno.ENAMETOOLONG: REFUSED,
    errno.ELOOP: REFUSED,
    errno.EXDEV: REFUSED,
    errno.EBUSY: REFUSED,
    errno.EACCES: DENIED,
    errno.EPERM: DENIED,
    errno.EROFS: DENIED,
    errno.ENOSPC: FULL,
    errno.EDQUOT: FULL,
    errno.EFBIG: FULL,
}
#: Directories one recursive watch follows at most.
MAX_WATCHED_DIRS = 1000
HEARTBEAT = 5.0
#: The temporary name the host's streamed writes use beside their target
#: (``kernel_sandbox.files.AsyncFiles.write_stream``): ``.NAME.<12 hex>.part``.
TEMP = re.compile(r"^\.(.+)\.[0-9a-f]{12}\.part$")


def protected(path: str, places: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p.rstrip("/") + "/") for p in places)


def name_of(ids: dict[int, str], uid: int, lookup: object) -> str:
    if uid not in ids:
        try:
            ids[uid] = lookup(uid)[0]  # type: ignore[operator]
        except (KeyError, OverflowError):
            ids[uid] = str(uid)
    return ids[uid]


_USERS: dict[int, str] = {}
_GROUPS: dict[int, str] = {}


#: Bytes of one entry's metadata (keys and values) read at most; the host sets it per call.
META_BYTES = 1024
META_PREFIX = "user.e2b."


def metadata(path: str) -> dict[str, str]:
    """The entry's ``user.e2b.*`` xattrs, prefix stripped (what envd calls metadata), up
    to ``META_BYTES`` of keys and values."""
    found: dict[str, str] = {}
    try:
        names = sorted(n for n in os.listxattr(path) if n.startswith(META_PREFIX))
    except OSError:
        return found
    room = META_BYTES
    for name in names:
        try:
            value = os.getxattr(path, name)[:room].decode("ascii", "replace")
        except OSError:
            continue
        key = name[len(META_PREFIX) :]
        room -= len(key) + len(value)
        if room < 0:
            break
        found[key] = value
    return found


def entry(path: str) -> dict[str, object]:
    """``path``'s entry as envd gives it: a symlink has its target's type and mode (no
    type when the link is broken), its own size, and the path it resolves to."""
    info = os.lstat(path)
    mode = info.st_mode
    permissions = stat.filemode(info.st_mode)
    target = None
    if stat.S_ISLNK(info.st_mode):
        permissions = "L" + permissions[1:]  # as Go's FileMode names a link
        try:
            target = os.path.realpath(path, strict=True)
            mode = os.stat(target).st_mode
        except (OSError, RuntimeError):
            target, mode = path, 0
    kind = "file" if stat.S_ISREG(mode) else "directory" if stat.S_ISDIR(mode) else "unknown"
    return {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "type": kind,
        "path": path,
        "size": info.st_size,
        "mode": stat.S_IMODE(mode),
        "permissions": permissions,
        "owner": name_of(_USERS, info.st_uid, pwd.getpwuid),
        "group": name_of(_GROUPS, info.st_gid, grp.getgrgid),
        "mtime_ns": info.st_mtime_ns,
        "symlink_target": target,
        "metadata": metadata(path),
    }


def holds_bytes(path: str) -> bool:
    """Whether ``path`` is a regular file (not a link to one) with something in it."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size > 0


def emit(value: object) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def fail(code: int, message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def listing(root: str, depth: int, limit: int, places: list[str]) -> None:
    if not os.path.isdir(root):
        fail(NOT_DIR, f"not a directory: {root}")
    count = 0
    level = [root]
    for _ in range(depth):
        below = []
        for folder in level:
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                path = os.path.join(folder, name)
                if protected(path, places):
                    continue
                try:
                    found = entry(path)
                except OSError:
                    continue
                emit(found)
                count += 1
                if count > limit:
                    return
                if found["type"] == "directory" and found["symlink_target"] is None:
                    below.append(path)  # as envd walks: links are entries, not followed
        level = below


_IN_MODIFY, _IN_ATTRIB = 0x2, 0x4
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_ISDIR, _IN_Q_OVERFLOW = 0x400, 0x40000000, 0x4000
#: What envd's watcher (fsnotify) asks inotify for.
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_MASK |= _IN_DELETE_SELF


def watch(root: str, recursive: bool, places: list[str], scan: int, with_entry: bool) -> None:
    """Print ``root``'s events as envd names them (fsnotify's: a rename is ``rename`` of
    the old name and ``create`` of the new).  Recursive: every directory below is
    watched too, and one that appears while watching is listed as it is watched (at
    most ``scan`` entries): what was made in it before its watch began is told as
    created, so nothing made there right after it goes unseen.  ``with_entry``: each
    event carries the entry's information where the path still exists."""
    if not os.path.lexists(root):
        fail(MISSING, f"no such directory: {root}")
    if not os.path.isdir(root):
        fail(NOT_DIR, f"not a directory: {root}")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        fail(1, f"inotify is not available: {os.strerror(ctypes.get_errno())}")
    folders: dict[int, str] = {}

    def add(folder: str, found: list[str] | None) -> None:
        if len(folders) >= MAX_WATCHED_DIRS or protected(folder, places):
            return
        wd = libc.inotify_add_watch(fd, folder.encode(), _MASK)
        if wd < 0:
            return
        folders[wd] = folder
        if not recursive:
            return
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return
        for name in names:
            path = os.path.join(folder, name)
            if found is not None and len(found) < scan and not TEMP.match(name):
                found.append(path)
            if os.path.isdir(path) and not os.path.islink(path):
                add(path, found)

    def tell(path: str, kind: str) -> None:
        event: dict[str, object] = {"name": os.path.relpath(path, root), "type": kind}
        if with_entry:
            with contextlib.suppress(OSError):  # gone already (removed, renamed away):
                event["entry"] = entry(path)  # no entry, as envd's
        emit(event)

    add(root, None)
    emit({"start": True})
    moving: dict[int, str] = {}  # rename cookie -> the temporary name moved away
    while True:
        ready, _, _ = select.select([fd], [], [], HEARTBEAT)
        if not ready:
            emit({})
            continue
        data = os.read(fd, 65536)
        offset = 0
        while offset + 16 <= len(data):
            wd, mask, cookie, size = struct.unpack_from("iIII", data, offset)
            raw = data[offset + 16 : offset + 16 + size].rstrip(b"\0")
            offset += 16 + size
            folder = folders.get(wd)
            if folder is None or mask & _IN_Q_OVERFLOW:
                continue
            path = os.path.join(folder, os.fsdecode(raw)) if raw else folder
            if mask & _IN_DELETE_SELF:
                if folder == root:
                    return
                continue  # its parent told its removal
            temp = TEMP.match(os.path.basename(path))
            if temp:  # a write of the file API in progress: told as the target's events
                if mask & _IN_MOVED_FROM:
                    if len(moving) > MAX_WATCHED_DIRS:
                        moving.clear()
                    moving[cookie] = temp.group(1)
                continue
            if mask & _IN_MOVED_TO and moving.pop(cookie, None) == os.path.basename(path):
                for kind in ("create", "chmod", "write"):  # as envd's upload: open, chown, write
                    tell(path, kind)
                continue
            if mask & (_IN_CREATE | _IN_MOVED_TO):
                tell(path, "create")
                if recursive and mask & _IN_ISDIR:
                    found: list[str] = []
                    add(path, found)
                    for inner in found:
                        tell(inner, "create")
                        if holds_bytes(inner):
                            tell(inner, "write")
                continue
            if mask & _IN_MODIFY:
                kind = "write"
            elif mask & _IN_DELETE:
                kind = "remove"
            elif mask & _IN_MOVED_FROM:
                kind = "rename"
            else:
                kind = "chmod"
            tell(path, kind)


def main() -> int:
    spec = json.loads(sys.argv[1])
    global META_BYTES
    META_BYTES = int(spec.get("meta_bytes", META_BYTES))
    op, path, places = spec["op"], spec["path"], spec.get("protected", [])
    paths = [path, spec["destination"]] if op == "move" else [path]
    if any(protected(p, places) for p in paths):
        fail(PROTECTED, f"{path} is the sandbox's kernel connection, never touched")
    try:
        if op == "stat":
            emit(entry(path))
        elif op == "list":
            listing(path, int(spec["depth"]), int(spec["limit"]), places)
        elif op == "mkdir":
            if os.path.lexists(path):
                fail(EXISTS, f"{path} exists already")
            os.makedirs(path)
            emit(entry(path))
        elif op == "move":
            target = spec["destination"]
            parent = os.path.dirname(target)
            if parent:
                os.makedirs(parent, exist_ok=True)
            os.rename(path, target)
            emit(entry(target))
        elif op == "watch":
            recursive, entries = bool(spec.get("recursive")), bool(spec.get("entry"))
            watch(path, recursive, places, int(spec.get("scan", 0)), entries)
        elif op == "setmeta":  # metadata of a file just written: envd's user.e2b.* xattrs
            for key, value in spec["metadata"].items():
                os.setxattr(path, META_PREFIX + key, value.encode("ascii"))
            emit(entry(path))
    except FileNotFoundError as exc:
        fail(MISSING, f"no such file or directory: {exc.filename or path}")
    except NotADirectoryError as exc:
        fail(NOT_DIR, f"not a directory: {exc.filename or path}")
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            fail(EXISTS, f"{exc.filename or path} exists already")
        fail(CALLERS.get(exc.errno or 0, 1), f"{exc.strerror}: {exc.filename or path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
