"""Kernelspecs that start their kernel in a sandbox (``kernel-sandbox kernelspec install``).

The spec names the provisioner in ``metadata.kernel_provisioner`` and carries the
sandbox's settings there; secure defaults are those of
:class:`~kernel_sandbox.config.SandboxConfig` (no network, memory/CPU/process limits,
a non-root user, a read-only root filesystem).  ``argv`` is never run by a
jupyter_client that knows provisioners (7+); an older one would run it on this
machine, so it is a program that refuses, saying why.

Any kernel of the image can be the sandboxed one (``SandboxConfig.kernel``: ``ir``,
``deno``, ``bash``...): the spec then says that kernel's ``language`` (as its own
kernel.json in the image does, :data:`~kernel_sandbox.contexts.KNOWN_KERNELS`, so a
notebook opened with it is an R or TypeScript notebook), and its ``interrupt_mode``
is ``signal`` whatever the kernel wants: the SIGINT goes to the sandbox's relay,
which interrupts a kernel the way its own kernelspec asks
(:mod:`kernel_sandbox.programs.relay`).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..config import SandboxConfig
from ..contexts import KNOWN_KERNELS
from ..errors import ConfigError
from .notebook_dir import CWD_MODES, CwdMode

__all__ = [
    "PROVISIONER_NAME",
    "install_kernelspec",
    "kernelspec_json",
    "remove_kernelspec",
]

#: The provisioner's entry-point name (group ``jupyter_client.kernel_provisioners``).
PROVISIONER_NAME = "kernel-sandbox"
#: Names for Jupyter's launcher where the image's own display name would not do.
_LAUNCHER_NAMES = {"python3": "Python 3"}
_NAME = re.compile(r"^[a-z0-9._-]{1,64}$")


def kernelspec_json(
    config: SandboxConfig,
    display_name: str | None = None,
    host: str = "",
    cwd_mode: CwdMode = "copy",
    language: str | None = None,
) -> dict[str, Any]:
    """The ``kernel.json`` of a sandboxed kernel with ``config`` (its ``kernel`` is the
    image's kernelspec that runs; ``language`` says its language when it is not one of
    :data:`~kernel_sandbox.contexts.KNOWN_KERNELS`).

    ``cwd_mode`` says what the kernel sees of its notebook's folder (see
    :mod:`~kernel_sandbox.jupyter.notebook_dir`).
    """
    if cwd_mode not in CWD_MODES:
        raise ConfigError(f"cwd_mode={cwd_mode!r}: use one of {', '.join(CWD_MODES)}")
    settings = config.model_dump(mode="json", exclude_defaults=True)
    settings["image"] = config.image
    provisioner: dict[str, Any] = {"sandbox": settings, "cwd_mode": cwd_mode}
    if host:
        provisioner["host"] = host
    known = KNOWN_KERNELS.get(config.kernel)
    shown = _LAUNCHER_NAMES.get(config.kernel) or (known.display_name if known else config.kernel)
    return {
        "argv": [sys.executable, "-m", "kernel_sandbox.jupyter.refuse", "{connection_file}"],
        "display_name": display_name or f"{shown} (sandbox {config.image})",
        "language": language or (known.language if known else config.kernel),
        "interrupt_mode": "signal",
        "metadata": {
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": provisioner},
            "debugger": False,
        },
    }


def install_kernelspec(
    name: str,
    config: SandboxConfig,
    *,
    display_name: str | None = None,
    host: str = "",
    user: bool = False,
    prefix: str | None = None,
    cwd_mode: CwdMode = "copy",
    language: str | None = None,
) -> Path:
    """Install the kernelspec ``name`` (like ``jupyter kernelspec install``); its path."""
    from jupyter_client.kernelspec import KernelSpecManager

    if not _NAME.match(name):
        raise ConfigError(
            f"kernelspec name {name!r}: use 1-64 of lowercase letters, digits, '.', '_', '-'"
        )
    spec = kernelspec_json(config, display_name, host, cwd_mode, language)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        where = KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=name, user=user, prefix=prefix
        )
    return Path(where)


def remove_kernelspec(name: str) -> Path:
    """Remove an installed kernelspec; its former path."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return Path(KernelSpecManager().remove_kernel_spec(name))
    except (NoSuchKernel, KeyError) as exc:
        raise ConfigError(f"no kernelspec named {name!r}") from exc
