"""Programs that run inside a sandbox, kept as files so the linters see them.

They live in ``kernel_sandbox/programs/`` (package data, not a Python package: nothing
there may be imported on the host): ``supervisor.sh`` (the container's main process),
``binder.py`` and ``launcher.py`` (the kernel's sockets and the kernel itself),
``relay.py`` (any other kernelspec, behind a relay), ``forwarder.py`` (the egress
relay, and an exact-ready kernel's bridge),
``shell_runner.sh`` (one shell command with its timeout), ``probe.py`` (what Python
an image has) and ``e2b_process.py``/``e2b_files.py``/``e2b_display.py`` (E2B's
commands, file calls and display conventions).
ruff checks the Python ones and shellcheck the shell ones (``make lint``).
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["NAMES", "program"]

#: Every program shipped in ``kernel_sandbox/programs/``.
NAMES = (
    "binder.py",
    "e2b_display.py",
    "e2b_files.py",
    "e2b_process.py",
    "forwarder.py",
    "launcher.py",
    "probe.py",
    "relay.py",
    "shell_runner.sh",
    "snapshot.py",
    "supervisor.sh",
)


@functools.cache
def program(name: str) -> str:
    """The source of the program ``name`` (one of :data:`NAMES`), read once per process."""
    if name not in NAMES:
        raise ValueError(f"no sandbox program is named {name!r}; the programs are {NAMES}")
    return resources.files("kernel_sandbox").joinpath("programs", name).read_text("utf-8")
