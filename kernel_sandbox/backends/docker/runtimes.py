"""The OCI runtimes a Docker engine offers, and what a sandbox needs from gVisor's ``runsc``.

``SandboxConfig.runtime`` names one of the engine's runtimes (``docker info`` lists
them).  gVisor puts a user-space kernel between the sandbox and the host's kernel; it
works with our kernel host unchanged if the engine registers ``runsc`` with three
arguments, each for a reason:

* ``--network=none``: runsc refuses containers whose network namespace is the host's
  (what Docker's ``network_mode="none"`` gives it); the sandbox gets only loopback.
* ``--host-uds=all``: the kernel's unix sockets are made inside the sandbox on the
  bind-mounted run directory, and the host must connect to them.
* ``--host-fifo=open``: the supervisor reports each kernel's end through a FIFO the host
  made in that directory (see :mod:`kernel_sandbox.kernel.supervisor`).

(``--oci-seccomp``, which would apply the engine's seccomp profile inside too, makes
the kernel fail to start with Debian's runsc of 2022-12: libzmq cannot start a thread.
So sandboxed code may make user namespaces under gVisor; they map to the sandbox user
and live in gVisor's kernel, not the host's.)

Two settings change meaning under gVisor and are translated here, not dropped:

* ``pids_limit``: the engine's pids cgroup counts the *host* tasks of gVisor's sentry
  (its own threads plus, on the ptrace platform, stub tasks for every process inside),
  and the sentry dies when it cannot make one, ending the whole sandbox.  So the limit
  on processes inside is ``RLIMIT_NPROC`` (which gVisor enforces for the sandbox alone,
  root included, with ``EAGAIN`` as Linux does), and the cgroup keeps a backstop sized
  for the sentry (:func:`gvisor_host_pids`), which grows with the square of the limit.
* ``memory_limit``: gVisor has no OOM killer inside; the host's kills the sentry, so an
  out-of-memory sandbox loses its whole container (files in its in-memory writable
  area too) and the engine reports ``OOMKilled``, which the sandbox names.

And two cannot hold at all and are refused: ``network_enabled=True`` and
``transport="tcp"`` (with ``--network=none`` the sandbox has no interface but ``lo``).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...limits import HOST_TASKS_CEILING

if TYPE_CHECKING:
    from .engine import ContainerSpec

__all__ = [
    "GVISOR_ARGS",
    "HOST_TASKS_CEILING",
    "Runtime",
    "daemon_json",
    "describe",
    "engine_runtimes",
    "gvisor_host_pids",
    "validate",
]

#: ``runtimeArgs`` a sandbox needs when the engine runs it under runsc (see above).
GVISOR_ARGS = ("--network=none", "--host-uds=all", "--host-fifo=open")
#: Host tasks of a gVisor sandbox beside its stub threads (sentry threads, gofer: ~40 idle).
_SENTRY_TASKS = 256


@dataclass(frozen=True)
class Runtime:
    """One runtime as the engine reports it."""

    name: str
    path: str
    args: tuple[str, ...] = ()

    @property
    def gvisor(self) -> bool:
        """True for gVisor's runsc, whatever name the engine registered it under."""
        return posixpath.basename(self.path).startswith("runsc")


def engine_runtimes(info: dict[str, Any]) -> dict[str, Runtime]:
    """The runtimes in an engine's ``docker info`` answer, by name."""
    found = info.get("Runtimes") or {}
    return {
        name: Runtime(name, str(spec.get("path") or name), tuple(spec.get("runtimeArgs") or ()))
        for name, spec in found.items()
    }


def daemon_json(name: str = "runsc", path: str = "/usr/bin/runsc") -> str:
    """The ``daemon.json`` lines that register gVisor the way sandboxes need it."""
    entry = {"runtimes": {name: {"path": path, "runtimeArgs": list(GVISOR_ARGS)}}}
    return json.dumps(entry, indent=2)


def _enable_help(name: str) -> str:
    return (
        "install gVisor (Debian/Ubuntu: `apt-get install runsc`), add these lines to "
        f"the engine's config file (/etc/docker/daemon.json, or the file given to "
        f"dockerd's --config-file):\n{daemon_json(name)}\nthen reload the engine with "
        "`sudo kill -HUP $(pidof dockerd)` (running containers keep running)"
    )


def gvisor_host_pids(pids_limit: int) -> int:
    """The host pids-cgroup backstop for a gVisor sandbox allowed ``pids_limit`` processes.

    On the ptrace platform every address space inside is a stub process on the host,
    which gets a traced thread for each sentry thread that ever ran one of its tasks
    (gVisor keeps them, and keeps released stubs for reuse).  The sentry holds about two
    threads per busy process (one pinned to each stub, one per task running), so while
    P processes stay busy (a fork bomb held at the limit, a pool of workers) the host
    tasks grow for ~20 s towards ~2 P²: 2 192 for P=32, 4 720 for P=48, 8 434 for P=64
    (Debian's runsc 2022-12, a Python fork bomb held for 30-40 s).  A backstop below
    that ends the whole sandbox (the sentry panics when a clone fails) instead of the
    kernel being restarted in place.  Above ``HOST_TASKS_CEILING`` (``pids_limit`` > 83)
    the backstop stays there: the sandbox then survives such a workload only for a while.
    """
    needed = _SENTRY_TASKS + (pids_limit + 4) * (2 * pids_limit + 16)
    return min(needed, HOST_TASKS_CEILING)


def validate(runtimes: dict[str, Runtime], spec: ContainerSpec) -> Runtime | None:
    """The runtime ``spec`` asks for, checked; a ``ConfigError`` saying what to change if not.

    None when ``spec`` leaves the choice to the engine.
    """
    if spec.runtime is None:
        return None
    runtime = runtimes.get(spec.runtime)
    if runtime is None:
        offered = ", ".join(sorted(runtimes)) or "none reported"
        if spec.runtime.startswith("runsc") or spec.runtime == "gvisor":
            how = _enable_help(spec.runtime)
        else:
            how = 'register it under "runtimes" in the engine\'s daemon.json, or use one it has'
        raise ConfigError(
            f"runtime={spec.runtime!r}: the Docker engine has no such runtime (it offers: "
            f"{offered}); {how}"
        )
    if not runtime.gvisor:
        return runtime
    missing = [arg for arg in GVISOR_ARGS if arg not in runtime.args]
    if missing:
        raise ConfigError(
            f"runtime={spec.runtime!r} is gVisor, registered without {' '.join(missing)} "
            f"(it has: {' '.join(runtime.args) or 'no runtimeArgs'}), which sandboxes need "
            f"(see kernel_sandbox/backends/docker/runtimes.py); {_enable_help(spec.runtime)}"
        )
    # a network of its own means the tcp transport, which reaches the kernel over it
    if spec.network_enabled or spec.published_ports or spec.own_network:
        raise ConfigError(
            f"runtime={spec.runtime!r} runs sandboxes with gVisor's --network=none: they "
            "have only loopback, so network_enabled=True and transport='tcp' cannot hold "
            "there; use the default runtime for a sandbox with a network"
        )
    return runtime


def describe(info: dict[str, Any]) -> str:
    """One line for people: the engine's runtimes, its default, and whether gVisor is ready."""
    default = str(info.get("DefaultRuntime") or "runc")
    parts = []
    for name, runtime in sorted(engine_runtimes(info).items()):
        notes = ["default"] if name == default else []
        if runtime.gvisor:
            missing = [arg for arg in GVISOR_ARGS if arg not in runtime.args]
            notes.append(
                f"gVisor, lacks {' '.join(missing)}" if missing else f"gVisor: runtime={name!r}"
            )
        parts.append(f"{name} ({', '.join(notes)})" if notes else name)
    line = f"engine runtimes: {', '.join(parts) or 'none reported'}"
    if not any(r.gvisor for r in engine_runtimes(info).values()):
        line += " (no gVisor: see docs/how-to/gvisor.md to add runsc)"
    return line
