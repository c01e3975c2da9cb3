"""Kernel hosts by name: the entry-point factory, as jupyter_client finds provisioners.

A package adds an engine by declaring, in its ``pyproject.toml``::

    [project.entry-points."kernel_sandbox.hosts"]
    kubernetes = "my_package.hosts:KubernetesHost"

and users pick it with ``SandboxConfig(host="kubernetes")`` (or ``host=`` on
``AsyncSandbox.create``, the pool and the manager).  ``docker`` and ``local`` are
built in: they are found even when the installed metadata predates their entry points.
Each name is resolved once per process (scanning the installed distributions' entry
points takes tens of milliseconds, and a server resolves a host on every create): a
host installed later is found by a new process, as jupyter_client's provisioners are.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, TypeAlias

from ..errors import ConfigError
from .base import HOSTS_GROUP, KernelHost

if TYPE_CHECKING:
    from ..config import SandboxConfig

__all__ = ["BUILTIN_HOSTS", "HostFactory", "available_hosts", "host_class", "make_host"]

#: Makes the host of one sandbox from its id and configuration; a host class is one.
HostFactory: TypeAlias = Callable[[str, "SandboxConfig"], KernelHost]

#: Hosts that ship with kernel_sandbox (also declared as entry points).
BUILTIN_HOSTS = {
    "docker": "kernel_sandbox.backends.docker:DockerHost",
    "local": "kernel_sandbox.testing:LocalKernelHost",
    "kubernetes": "kernel_sandbox.backends.kubernetes:KubernetesHost",
}


def available_hosts() -> list[str]:
    """The names of every host that can be asked for."""
    return sorted({ep.name for ep in entry_points(group=HOSTS_GROUP)} | set(BUILTIN_HOSTS))


@functools.cache
def host_class(name: str) -> type[KernelHost]:
    """The host class registered under ``name``; a :class:`ConfigError` names the known ones."""
    found = list(entry_points(group=HOSTS_GROUP, name=name))
    if found:
        target = found[0].load()
    elif name in BUILTIN_HOSTS:
        module, _, attr = BUILTIN_HOSTS[name].partition(":")
        target = getattr(importlib.import_module(module), attr)
    else:
        raise ConfigError(
            f"no kernel host is named {name!r} (host=); the known ones are "
            f"{', '.join(available_hosts())} (more come from the {HOSTS_GROUP!r} entry points)"
        )
    if not (isinstance(target, type) and issubclass(target, KernelHost)):
        raise ConfigError(f"the kernel host {name!r} is {target!r}, not a KernelHost class")
    return target


def make_host(host: str | HostFactory | None, sandbox_id: str, config: SandboxConfig) -> KernelHost:
    """The host of one sandbox: by name, from a factory, or ``config.host`` when None."""
    if host is None:
        host = config.host
    factory = host_class(host) if isinstance(host, str) else host
    return factory(sandbox_id, config)
