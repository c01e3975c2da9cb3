"""Inside the sandbox's kernel: write a portable snapshot to a FIFO, or load one from it.

Sent as source by the host and run in a private namespace of the kernel (never in the
user's), as the sandbox user; the host only ever sees the tar stream this writes (which
it stores as opaque bytes, counting its members) and one line of JSON (the report).
Nothing here is imported on the host.

The stream is a tar archive (PAX):

* ``<place>/<path>`` — the files of each place (``work``: the working directory,
  ``home``: ``$HOME``, ``tmp``: ``/tmp``), regular files, directories and symlinks;
* ``meta/modules.json`` — ``{name: module}`` for every module bound in the namespace
  (re-imported by name on load);
* ``mpl/rcParams`` — matplotlib's settings, when the session imported it (module state
  that no variable holds), pickled as a variable is;
* ``ns/<name>`` — one variable each, pickled by ``dill`` (``pickle`` if the image has
  no dill) with protocol 5: ``<Q pickle size><I buffer count>`` + ``<Q size>`` per
  out-of-band buffer, then the pickle, then the buffers (numpy and pandas data go out
  of band: no copy of an array is made to save it).

A variable that cannot be pickled is reported by name with the reason, and the rest is
saved; so is one whose loading fails.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import socket
import stat
import struct
import sys
import tarfile
import threading
import types
from typing import Any

try:
    import dill as _pickler

    _DILL = True
except ImportError:  # an image without dill: the standard pickle (no lambdas, no classes)
    _pickler = pickle
    _DILL = False

#: Printed before the one JSON line of the report, so stray output cannot be taken for it.
MARK = "@@kernel-sandbox-snapshot-report@@"
#: Longest reason kept for a variable that was not saved.
REASON_CHARS = 300
_HEADER = struct.Struct("<QI")
_SIZE = struct.Struct("<Q")
_COPY = 1 << 20

_REFUSED: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (
        io.IOBase,
        "an open file: its handle cannot move to another sandbox (the file itself is "
        "saved if it is in the working directory, $HOME or /tmp)",
    ),
    (socket.socket, "an open socket: connections do not survive a snapshot"),
    (threading.Thread, "a thread: running code is not saved by a portable snapshot"),
    (
        (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType),
        "a generator: its paused frame cannot be pickled",
    ),
)


class SnapshotRefused(Exception):
    """The snapshot cannot be made as asked (too many files, a place unreadable)."""


def _shell() -> Any:
    from IPython.core.getipython import get_ipython

    return get_ipython()  # type: ignore[no-untyped-call]


def _user_namespace() -> tuple[dict[str, Any], dict[str, Any]]:
    shell = _shell()
    return shell.user_ns, shell.user_ns_hidden


def _user_variables() -> list[tuple[str, Any]]:
    """The names a user bound: not IPython's own, not ``_``-private ones."""
    ns, hidden = _user_namespace()
    return [
        (name, value)
        for name, value in list(ns.items())
        if not name.startswith("_") and not (name in hidden and hidden[name] is value)
    ]


class _Chain(io.RawIOBase):
    """Several byte buffers read as one file (what ``TarFile.addfile`` copies from)."""

    def __init__(self, parts: list[Any]) -> None:
        self._parts = [memoryview(p).cast("B") for p in parts]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._parts and not len(self._parts[0]):
            self._parts.pop(0)
        if not self._parts:
            return 0
        first = self._parts[0]
        n = min(len(buffer), len(first))
        buffer[:n] = first[:n]
        self._parts[0] = first[n:]
        return n


def _refusal(value: Any) -> str:
    for kind, reason in _REFUSED:
        if isinstance(value, kind):
            return reason
    return ""


def _add_place(
    tar: tarfile.TarFile,
    key: str,
    root: str,
    skip: set[str],
    budget: dict[str, int],
    errors: list[str],
) -> None:
    """Add the tree under ``root`` as ``key/...`` (links are stored, never followed)."""
    if not os.path.isdir(root):
        return
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            if path in skip:
                continue
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue  # gone since the listing
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                continue  # sockets, FIFOs, devices: nothing to carry
            budget["files"] -= 1
            if budget["files"] < 0:
                raise SnapshotRefused(
                    f"more than {budget['max_files']} files in the working directory, $HOME "
                    "and /tmp: delete some, or leave /tmp out"
                )
            arcname = key + "/" + os.path.relpath(path, root)
            try:
                tar.add(path, arcname=arcname, recursive=False)
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror or exc}")


def save(fifo: str, places: dict[str, str], skip: list[str], max_files: int) -> dict[str, Any]:
    """Write the snapshot stream into ``fifo``; return the report (what was, was not saved)."""
    report: dict[str, Any] = {
        "saved": {},
        "not_saved": {},
        "modules": {},
        "errors": [],
        "pickler": "dill" if _DILL else "pickle",
        "execution_count": _shell().execution_count,
    }
    skipped = {os.path.realpath(p) for p in skip} | {fifo}
    with (
        open(fifo, "wb") as out,  # first: the host's reader waits for this open
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        setattr(tar, "copybufsize", _COPY)  # noqa: B010 (untyped): big arrays in 1 MiB steps
        budget = {"files": max_files, "max_files": max_files}
        for key, root in places.items():
            _add_place(tar, key, os.path.expanduser(root), skipped, budget, report["errors"])
        variables = _user_variables()
        modules = {n: v.__name__ for n, v in variables if isinstance(v, types.ModuleType)}
        report["modules"] = modules
        data = json.dumps(modules).encode()
        info = tarfile.TarInfo("meta/modules.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        matplotlib = sys.modules.get("matplotlib")
        if matplotlib is not None:
            settings = {k: v for k, v in matplotlib.rcParams.items() if k != "backend"}
            _add_variable(tar, "rcParams", settings, {"saved": {}, "not_saved": {}}, "mpl/")
        for name, value in variables:
            if name not in modules:
                _add_variable(tar, name, value, report)
    return report


def _add_variable(
    tar: tarfile.TarFile, name: str, value: Any, report: dict[str, Any], prefix: str = "ns/"
) -> None:
    kind = type(value).__name__
    reason = _refusal(value)
    buffers: list[pickle.PickleBuffer] = []
    if not reason:
        try:
            options = {"recurse": True} if _DILL else {}
            data = _pickler.dumps(value, protocol=5, buffer_callback=buffers.append, **options)
            raws = [b.raw() for b in buffers]
        except Exception as exc:  # whatever the object's own pickling raises
            reason = f"cannot be pickled ({type(exc).__name__}: {exc})"
    if reason:
        report["not_saved"][name] = f"{kind}: {reason}"[:REASON_CHARS]
        return
    head = _HEADER.pack(len(data), len(raws)) + b"".join(_SIZE.pack(r.nbytes) for r in raws)
    info = tarfile.TarInfo(prefix + name)
    info.size = len(head) + len(data) + sum(r.nbytes for r in raws)
    tar.addfile(info, io.BufferedReader(_Chain([head, data, *raws]), _COPY))
    report["saved"][name] = {"type": kind, "bytes": info.size}


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, rest: str) -> None:
    """Extract one file member under ``root``; anything leaving it is refused."""
    root = os.path.realpath(root)
    target = os.path.normpath(os.path.join(root, rest))
    if not rest or os.path.isabs(rest) or not _inside(root, target):
        raise SnapshotRefused(f"{member.name}: outside its place")
    parent = os.path.realpath(os.path.dirname(target))
    if not _inside(root, parent):
        raise SnapshotRefused(f"{member.name}: a link leads outside its place")
    if member.isdir():
        os.makedirs(target, exist_ok=True)
        os.chmod(target, (member.mode & 0o777) | 0o700)
        return
    os.makedirs(parent, exist_ok=True)
    if os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    if member.issym():
        os.symlink(member.linkname, target)
    elif member.isfile():
        source = tar.extractfile(member)
        assert source is not None
        with open(target, "wb") as out:
            while chunk := source.read(_COPY):
                out.write(chunk)
        os.chmod(target, member.mode & 0o777)
        os.utime(target, (member.mtime, member.mtime))


def _load_variable(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Any:
    source = tar.extractfile(member)
    assert source is not None
    size, count = _HEADER.unpack(source.read(_HEADER.size))
    sizes = [_SIZE.unpack(source.read(_SIZE.size))[0] for _ in range(count)]
    data = source.read(size)
    buffers = [bytearray(source.read(n)) for n in sizes]
    return _pickler.loads(data, buffers=buffers)


def load(fifo: str, places: dict[str, str]) -> dict[str, Any]:
    """Read a snapshot stream from ``fifo`` into the namespace and the places."""
    report: dict[str, Any] = {"restored": [], "failed": {}, "files": 0, "errors": []}
    ns, _ = _user_namespace()
    roots = {k: os.path.expanduser(v) for k, v in places.items()}
    with open(fifo, "rb") as source, tarfile.open(fileobj=source, mode="r|") as tar:
        for member in tar:
            top, _, rest = member.name.partition("/")
            if top == "ns":
                try:
                    ns[rest] = _load_variable(tar, member)
                    report["restored"].append(rest)
                except Exception as exc:  # a class gone from the image, a module missing
                    why = f"cannot be loaded ({type(exc).__name__}: {exc})"
                    report["failed"][rest] = why[:REASON_CHARS]
            elif member.name == "mpl/rcParams":
                try:
                    import matplotlib

                    matplotlib.rcParams.update(_load_variable(tar, member))
                except Exception as exc:
                    report["failed"]["matplotlib.rcParams"] = f"{exc}"[:REASON_CHARS]
            elif member.name == "meta/modules.json":
                source_file = tar.extractfile(member)
                assert source_file is not None
                for name, module in json.load(source_file).items():
                    try:
                        ns[name] = importlib.import_module(module)
                        report["restored"].append(name)
                    except Exception as exc:
                        report["failed"][name] = f"module {module}: {exc}"[:REASON_CHARS]
            elif top in roots:
                try:
                    _extract(tar, member, roots[top], rest)
                    report["files"] += 1
                except (OSError, SnapshotRefused) as exc:
                    report["errors"].append(f"{member.name}: {exc}"[:REASON_CHARS])
    return report


def main(action: str, arguments: dict[str, Any]) -> None:
    """Run ``save`` or ``load`` and print the report (or the error) after :data:`MARK`."""
    try:
        result = (save if action == "save" else load)(**arguments)
    except Exception as exc:  # the host turns it into a SnapshotError
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    print(MARK + json.dumps(result), flush=True)
