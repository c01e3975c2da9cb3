"""Reading and crash-safe writing of ``.ipynb`` files.

A session notebook is rewritten after every step.  Writing in place would leave a
truncated, unreadable file if the process is killed mid-write, so every write goes to
a temporary file in the same directory, is flushed to disk, and then atomically
replaces the old file: a reader (or a crash) only ever sees a complete notebook.

The text is nbformat's on-disk form (multi-line strings split into lists, transient
keys dropped, keys sorted) serialised by orjson with a 2-space indent: nbformat's own
writer deep-copies the notebook and runs the pure-Python JSON encoder (``indent``
turns the C one off), which for a long session costs tens of milliseconds of GIL per
write, beside the server's requests.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat
import orjson
from nbformat import NotebookNode
from nbformat.validator import ValidationError

from ..errors import NotebookError

__all__ = [
    "notebook_text",
    "read_notebook",
    "replace_notebook",
    "replace_notebook_locked",
    "sessions_dir",
    "validate_notebook",
    "validate_parts",
    "write_notebook_atomic",
]


def sessions_dir(kind: str) -> Path:
    """Where sessions of ``kind`` are recorded when nobody says where:
    ``$XDG_DATA_HOME/kernel-sandbox/KIND`` (``~/.local/share/...``) — programs that
    start us (MCP clients, agent frameworks) pick any current directory, often ``/``."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "kernel-sandbox" / kind


def validate_notebook(nb: NotebookNode) -> None:
    """Raise :class:`NotebookError` unless ``nb`` is a valid nbformat v4 notebook."""
    try:
        nbformat.validate(nb)
    except ValidationError as exc:
        raise NotebookError(f"notebook is not valid nbformat v4: {exc.message}") from exc


def validate_parts(metadata: Any, cells: list[Any], minor: int = 5) -> None:
    """Validate ``metadata`` and ``cells`` as a notebook's (:class:`NotebookError`): what a
    writer that knows the other cells valid checks (the cells are not copied)."""
    validate_notebook(
        NotebookNode(nbformat=4, nbformat_minor=minor, metadata=metadata, cells=cells)
    )


def write_notebook_atomic(
    nb: NotebookNode, path: str | os.PathLike[str], *, validate: bool = True
) -> Path:
    """Validate ``nb`` and replace ``path`` with it atomically (temp file, fsync, rename).

    ``validate=False`` is for a caller that validated what may have changed itself.
    """
    if validate:
        validate_notebook(nb)
    target = Path(path)
    replace_notebook(nb, target)
    return target


def replace_notebook(nb: NotebookNode, target: Path) -> os.stat_result:
    """Replace ``target`` with ``nb`` atomically, unvalidated; the ``stat`` of the file
    written, taken before it is in place (so it is ours even when another writer
    replaces it at once)."""
    return _replace(nb, target, lock=False)[0]


def replace_notebook_locked(nb: NotebookNode, target: Path) -> tuple[os.stat_result, int]:
    """:func:`replace_notebook`, the new file already under an exclusive ``flock`` when it
    takes ``target``'s name: returns its ``stat`` and the descriptor holding that lock.

    A writer that keeps the notebook's lock across its writes (:mod:`.shared`) holds the
    lock of the file it replaces; a newcomer must find the new file locked too."""
    info, fd = _replace(nb, target, lock=True)
    assert fd is not None
    return info, fd


def _replace(nb: NotebookNode, target: Path, lock: bool) -> tuple[os.stat_result, int | None]:
    target.parent.mkdir(parents=True, exist_ok=True)
    text = notebook_text(nb) + "\n"
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:  # a new notebook in a private directory is private too
        mode = 0o600 if not target.parent.stat().st_mode & 0o077 else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    held = None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
            written = os.fstat(handle.fileno())
            if lock:  # open for writing (mkstemp): NFS grants an exclusive flock then
                held = os.dup(handle.fileno())
                fcntl.flock(held, fcntl.LOCK_EX)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if held is not None:
            os.close(held)
        raise
    _fsync_dir(target.parent)
    return written, held


def notebook_text(nb: Mapping[str, Any]) -> str:
    """``nb`` as the JSON text of an ``.ipynb`` file (``nb`` itself is not changed)."""
    data: dict[str, Any] = orjson.loads(orjson.dumps(nb, default=_bytes))  # a private copy
    for key in ("orig_nbformat", "orig_nbformat_minor", "signature"):
        data.get("metadata", {}).pop(key, None)
    for cell in data.get("cells", []):
        cell.get("metadata", {}).pop("trusted", None)
        if isinstance(cell.get("source"), str):
            cell["source"] = cell["source"].splitlines(True)
        for attachment in cell.get("attachments", {}).values():
            _split_bundle(attachment)
        for output in cell.get("outputs", []):
            if output.get("output_type") in ("execute_result", "display_data"):
                _split_bundle(output.get("data", {}))
            elif output.get("output_type") == "stream" and isinstance(output.get("text"), str):
                output["text"] = output["text"].splitlines(True)
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _split_bundle(bundle: dict[str, Any]) -> None:
    """nbformat's split of a mime bundle: text types become lists of lines, JSON stays."""
    for mime, value in bundle.items():
        is_json = mime == "application/json" or (
            mime.startswith("application/") and mime.endswith("+json")
        )
        if isinstance(value, str) and not is_json:
            bundle[mime] = value.splitlines(True)


def _bytes(value: object) -> str:
    """What nbformat's writer does with bytes: base64 text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} cannot be written into a notebook")


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every filesystem allows it, and the
    # notebook is already complete on disk, so failure here is harmless.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_notebook(path: str | os.PathLike[str]) -> NotebookNode:
    """Read a notebook as v4 (older versions are upgraded); raise NotebookError if unusable."""
    source = Path(path)
    try:
        nb = nbformat.read(source, as_version=4)
    except FileNotFoundError as exc:
        raise NotebookError(f"no notebook at {source}") from exc
    except (OSError, ValueError, ValidationError, KeyError, TypeError, AttributeError) as exc:
        # nbformat reports bad JSON, unknown versions and failed upgrades in many types
        raise NotebookError(f"cannot read {source} as a Jupyter notebook: {exc}") from exc
    try:
        validate_notebook(nb)
    except NotebookError as exc:
        raise NotebookError(f"{source}: {exc}") from exc
    return nb
