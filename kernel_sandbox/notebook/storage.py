"""Reading and crash-safe writing of ``.ipynb`` files.

A session notebook is rewritten after every step.  Writing in place would leave a
truncated, unreadable file if the process is killed mid-write, so every write goes to
a temporary file in the same directory, is flushed to disk, and then atomically
replaces the old file: a reader (or a crash) only ever sees a complete notebook.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbformat.validator import ValidationError

from ..errors import NotebookError

__all__ = ["read_notebook", "validate_notebook", "write_notebook_atomic"]


def validate_notebook(nb: NotebookNode) -> None:
    """Raise :class:`NotebookError` unless ``nb`` is a valid nbformat v4 notebook."""
    try:
        nbformat.validate(nb)
    except ValidationError as exc:
        raise NotebookError(f"notebook is not valid nbformat v4: {exc.message}") from exc


def write_notebook_atomic(nb: NotebookNode, path: str | os.PathLike[str]) -> Path:
    """Validate ``nb`` and replace ``path`` with it atomically (temp file, fsync, rename)."""
    validate_notebook(nb)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = nbformat.v4.writes(nb) + "\n"
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)
    return target


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
