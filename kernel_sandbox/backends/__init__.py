"""Kernel hosts: the interface (``base``), the factory by name, and the engines.

``docker/`` is the built-in engine; ``kernel_sandbox.testing.LocalKernelHost`` runs
kernels as local processes for tests.  Other engines register entry points in the
``kernel_sandbox.hosts`` group (see ``factory``).
"""

from .base import ExecResult, HostState, KernelHost, Leftover, SandboxRecord
from .factory import HostFactory, available_hosts, host_class, make_host

__all__ = [
    "ExecResult",
    "HostFactory",
    "HostState",
    "KernelHost",
    "Leftover",
    "SandboxRecord",
    "available_hosts",
    "host_class",
    "make_host",
]
