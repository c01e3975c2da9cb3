"""Ownership of sandbox run directories, so ``kernel-sandbox gc`` never takes a live one.

A sandbox's host run directory (under :func:`runtime_root`)
holds its kernel's sockets.  Its owner process keeps an advisory lock on a marker file
inside it for as long as the sandbox is open; the kernel releases such locks when the
process ends, however it ends (even ``kill -9``).  So "unlocked" means "no live process
on this host uses it", whichever engine the sandbox's container runs on.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from pathlib import Path

__all__ = ["OWNER_FILE", "adoption_dir", "claim", "is_claimed", "release", "runtime_root"]

#: Marker file inside a run directory; readable by its owner only (not by sandbox code).
OWNER_FILE = ".owner"


def runtime_root() -> Path:
    """The host directory that holds every sandbox's run directory, private to this user."""
    base = os.environ.get("KERNEL_SANDBOX_RUNTIME_DIR") or os.path.join(
        tempfile.gettempdir(), f"kernel-sandbox-{os.getuid()}"
    )
    root = Path(base)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    return root


def adoption_dir(sandbox_id: str) -> Path | None:
    """Where the adopter of a sandbox without a run directory (``tcp``) holds its claim:
    the sandbox's labels still name its dead first owner, and Docker cannot relabel.
    None for an id that could not be a sandbox's (ids come from labels)."""
    if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", sandbox_id):
        return None
    return runtime_root() / f"{sandbox_id}.adopted"


def claim(run_dir: Path) -> int:
    """Lock ``run_dir`` for this process; returns the descriptor to pass to :func:`release`."""
    fd = os.open(run_dir / OWNER_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def release(fd: int) -> None:
    """Give up a claim made with :func:`claim`."""
    os.close(fd)


def is_claimed(run_dir: Path) -> bool:
    """True while a live process holds a claim on ``run_dir`` (or it cannot be checked)."""
    try:
        fd = os.open(run_dir / OWNER_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:  # not ours to judge
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
