"""Running an image's own code on the engine under a sandbox's limits, never more.

Deriving an image means running *its* Python: to describe it (the probe), to build
the venv, to let its pip check the wheels.  The image may be a tenant's, so each of
these runs as a sandbox would: uid 65534, every capability dropped,
``no-new-privileges``, a read-only root with a small in-memory /tmp, no network,
memory, pids and CPU bounded by the sandbox's own limits and never past
``IMAGE_STEP_*`` (:mod:`kernel_sandbox.limits`; a :class:`Confinement`), killed at its
deadline, no engine log kept, and under the OCI runtime the sandbox will have
(``runtime="runsc"``: gVisor, its process limit counted inside as a sandbox's is, see
:mod:`..runtimes`), so nothing of the image ever meets the host's kernel directly when
its sandboxes would not, nor gets more memory than they would.  Its output is read
from the attach stream and bounded: stderr (and stdout unless it is a payload) keeps
only its head and tail, and a step that prints past ``IMAGE_STEP_CHATTER_BYTES`` is
killed;
a payload on stdout (the venv's tar) is copied to a sink up to a byte cap, past
which the container is killed.  Input goes in on stdin (a tar), so nothing of the
host is mounted and a remote engine works too.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import dataclass
from typing import IO, Any

import docker
import docker.errors
from docker.types import LogConfig, Ulimit

from ....errors import ConfigError
from ....limits import (
    IMAGE_STEP_CHATTER_BYTES,
    IMAGE_STEP_CPUS,
    IMAGE_STEP_MEMORY_BYTES,
    IMAGE_STEP_OUTPUT_BYTES,
    IMAGE_STEP_PIDS,
    IMAGE_STEP_TMP_BYTES,
    HeadTail,
)
from ..attach import STDOUT, attach_body, read_frames
from ..runtimes import engine_runtimes, gvisor_host_pids

__all__ = ["NOBODY", "PROBE_LABEL", "Confinement", "StepResult", "run_confined"]

log = logging.getLogger("kernel_sandbox.images")

#: The user every step runs as (the kernel's nobody): no account of the image is used.
NOBODY = "65534:65534"
#: Label of these containers (``gc`` and tests find leftovers by it).
PROBE_LABEL = "kernel-sandbox.probe"


@dataclass(frozen=True)
class Confinement:
    """What a step runs under: the sandbox's OCI runtime and, at most, its limits."""

    #: The engine's OCI runtime (None: the engine's default).
    runtime: str | None = None
    memory_bytes: int = IMAGE_STEP_MEMORY_BYTES
    pids: int = IMAGE_STEP_PIDS
    cpus: float = IMAGE_STEP_CPUS

    @classmethod
    def of(cls, runtime: str | None, memory_bytes: int, pids: int, cpus: float) -> Confinement:
        """A sandbox's runtime and limits, each lowered to its ``IMAGE_STEP_*`` cap."""
        return cls(
            runtime,
            min(memory_bytes, IMAGE_STEP_MEMORY_BYTES),
            min(pids, IMAGE_STEP_PIDS),
            min(cpus, IMAGE_STEP_CPUS),
        )


@dataclass(frozen=True)
class StepResult:
    """How one confined step ended."""

    #: Exit status; None when the process never started (e.g. no such executable).
    code: int | None
    #: stderr (and stdout when it was not a payload), head and tail, decoded.
    output: str
    #: Why the host stopped it: "" or a sentence (deadline, payload over its cap).
    stopped: str = ""


def _host_config(api: Any, tmpfs: dict[str, str], limits: Confinement) -> Any:
    runtime = limits.runtime
    pids, ulimits = limits.pids, [Ulimit(name="core", soft=0, hard=0)]
    if runtime is not None:
        known = engine_runtimes(api.info())
        if runtime not in known:
            offered = ", ".join(sorted(known)) or "none reported"
            raise ConfigError(
                f"runtime={runtime!r}: the Docker engine has no such runtime (it offers: "
                f"{offered}); an image's probe runs under the sandbox's runtime, or not at all"
            )
        if known[runtime].gvisor:  # processes counted inside, the cgroup sized for the sentry
            ulimits.append(Ulimit(name="nproc", soft=limits.pids, hard=limits.pids))
            pids = gvisor_host_pids(limits.pids)
    return api.create_host_config(
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=limits.memory_bytes,
        memswap_limit=limits.memory_bytes,
        pids_limit=pids,
        ulimits=ulimits,
        nano_cpus=int(limits.cpus * 1e9),
        read_only=True,
        tmpfs={"/tmp": f"rw,nosuid,nodev,size={IMAGE_STEP_TMP_BYTES}", **tmpfs},
        log_config=LogConfig(type=LogConfig.types.NONE),
        runtime=runtime,
    )


def run_confined(
    client: docker.DockerClient,
    image: str,
    argv: list[str],
    *,
    timeout: float,
    stdin: IO[bytes] | None = None,
    stdout_to: IO[bytes] | None = None,
    stdout_cap: int = 0,
    tmpfs: dict[str, str] | None = None,
    limits: Confinement | None = None,
) -> StepResult:
    """Run ``argv`` in ``image`` under sandbox limits; see the module docstring.

    ``stdin`` is sent and then closed; ``stdout_to`` receives stdout (at most
    ``stdout_cap`` bytes); ``tmpfs`` adds in-memory mounts (path -> mount options);
    ``limits`` is the sandbox's runtime and limits (default: ``IMAGE_STEP_*`` under
    the engine's default runtime).  The container is removed whatever happens.
    """
    api = client.api
    limits = limits or Confinement()
    container = api.create_container(
        image,
        command=argv[1:],
        entrypoint=argv[:1],
        user=NOBODY,
        environment={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
        working_dir="/tmp",
        network_disabled=True,
        labels={PROBE_LABEL: "1"},
        stdin_open=stdin is not None,  # the SDK sets StdinOnce with it
        host_config=_host_config(api, tmpfs or {}, limits),
    )["Id"]
    stopped: list[str] = []

    def stop(reason: str) -> None:
        if not stopped:
            stopped.append(reason)
        with contextlib.suppress(docker.errors.APIError):
            api.kill(container)

    timer = threading.Timer(timeout, stop, [f"stopped after its deadline of {timeout:g} s"])
    try:
        params = {"stdout": 1, "stderr": 1, "stream": 1, "stdin": int(stdin is not None)}
        response = api.post(
            api._url("/containers/{0}/attach", container),
            None,
            params=params,
            stream=True,
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        )
        with response:
            body = attach_body(response)
            api._disable_socket_timeout(body.raw)
            try:
                api.start(container)
            except docker.errors.APIError as exc:  # e.g. executable file not found
                return StepResult(None, str(exc.explanation or exc))
            timer.start()
            if stdin is not None:
                _send(body, stdin)
            output = HeadTail(IMAGE_STEP_OUTPUT_BYTES)
            sent = chatter = 0
            with contextlib.suppress(OSError, EOFError):
                for stream, piece in read_frames(body):
                    if stream != STDOUT or stdout_to is None:
                        output.add(piece)
                        chatter += len(piece)
                        if chatter > IMAGE_STEP_CHATTER_BYTES:
                            stopped.append(
                                f"it printed more than {IMAGE_STEP_CHATTER_BYTES:,} bytes"
                            )
                            break
                        continue
                    sent += len(piece)
                    if sent > stdout_cap:
                        stopped.append(f"its output passed the cap of {stdout_cap:,} bytes")
                        break
                    stdout_to.write(piece)
        if stopped:  # killed only now, its output's connection closed: under gVisor a
            # kill waits for a process blocked writing into a pipe nobody reads (60 s)
            stop(stopped[0])
        code = api.wait(container, timeout=timeout + 30)["StatusCode"]
        if not stopped and api.inspect_container(container)["State"].get("OOMKilled"):
            stopped.append(
                f"it ran out of memory: {limits.memory_bytes // 1024**2} MiB, the sandbox's "
                "memory_limit (at most kernel_sandbox.limits.IMAGE_STEP_MEMORY_BYTES)"
            )
        text = output.value().decode(errors="replace")
        return StepResult(int(code), text, stopped[0] if stopped else "")
    finally:
        timer.cancel()
        with contextlib.suppress(docker.errors.APIError):
            api.remove_container(container, force=True)


def _send(body: Any, stdin: IO[bytes]) -> None:
    """Copy ``stdin`` into the attach connection, then close its writing half."""
    raw: Any = body.raw
    sock = getattr(raw, "_sock", raw)
    if not isinstance(sock, socket.socket):
        raise OSError(f"this engine connection ({type(sock).__name__}) cannot carry input")
    # A step that ends without reading its input (it failed) closes the pipe: its
    # output and status tell why.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while chunk := stdin.read(64 * 1024):
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
