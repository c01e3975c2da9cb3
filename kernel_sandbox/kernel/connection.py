"""Connection info for a kernel in a container, seen from the host and from inside.

With the ``ipc`` transport the five ZMQ sockets are unix sockets in a directory that
is bind-mounted into the container, so the container needs no network at all.  The
kernel and the host see the same files under different paths; ``ip`` is the socket
path prefix (``{ip}-{port}`` is the socket file).
"""

from __future__ import annotations

import json
import posixpath
import secrets
import socket
from typing import Literal, NotRequired, TypedDict

import zmq

from ..config import CONTAINER_RUN_DIR
from .programs import program
from .supervisor import SUPERVISOR

__all__ = [
    "BINDER",
    "CONTAINER_RUN_DIR",
    "IPYTHON_KERNEL",
    "LAUNCHER",
    "RELAY",
    "ConnectionInfo",
    "free_tcp_ports",
    "ipc_socket_names",
    "kernel_command",
    "launch_command",
    "new_connection_info",
]

PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")

#: With ipc, the container's main process until it execs the supervisor: binds the
#: kernel's sockets once (see the program's docstring).
BINDER = program("binder.py")
#: The kernel, started (and restarted) by the supervisor.
LAUNCHER = program("launcher.py")
#: Any other kernelspec's kernel, behind a relay (see the program's docstring).
RELAY = program("relay.py")
#: The kernelspec the launcher runs in-process (ipykernel); every other goes through
#: :data:`RELAY`.
IPYTHON_KERNEL = "python3"


class ConnectionInfo(TypedDict):
    """The fields of a Jupyter connection file that kernel_sandbox uses."""

    transport: Literal["ipc", "tcp"]
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    key: str
    signature_scheme: str
    kernel_name: str
    #: tcp: the kernel's CURVE key pair (z85); jupyter_client and ipykernel use the
    #: same pair on both ends, so only a holder of the connection info can connect.
    curve_publickey: NotRequired[str]
    curve_secretkey: NotRequired[str]


def free_tcp_ports(count: int = 5) -> list[int]:
    """Ports that are free on this host right now (for the ``tcp`` transport)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def new_connection_info(
    transport: Literal["ipc", "tcp"], ip: str, ports: list[int] | None = None
) -> ConnectionInfo:
    """A fresh connection description with a random HMAC key."""
    ports = ports or [1, 2, 3, 4, 5]
    info: dict[str, object] = {
        "transport": transport,
        "ip": ip,
        "key": secrets.token_hex(32),
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }
    info.update(zip(PORT_NAMES, ports, strict=True))
    if transport == "tcp":
        # HMAC proves who sent a message but hides nothing: anyone who reaches a tcp
        # port (a local user, another container) could read iopub.  CURVE encrypts, and
        # refuses a peer that does not know the key.
        public, secret = zmq.curve_keypair()
        info.update(curve_publickey=public.decode(), curve_secretkey=secret.decode())
    return info  # type: ignore[return-value]


def ipc_socket_names(info: ConnectionInfo) -> set[str]:
    """The file names of the kernel's five unix sockets in their directory (``ipc``)."""
    prefix = posixpath.basename(info["ip"])
    return {f"{prefix}-{info[name]}" for name in PORT_NAMES}  # type: ignore[literal-required]


def kernel_command(python: str, kernel: str = IPYTHON_KERNEL) -> tuple[list[str], dict[str, str]]:
    """The command that runs kernelspec ``kernel`` of the image, with its environment:
    ipykernel in-process (:data:`LAUNCHER`), any other behind :data:`RELAY`."""
    if kernel == IPYTHON_KERNEL:
        return [python, "-c", LAUNCHER], {}
    return [python, "-c", RELAY], {"KERNEL_SANDBOX_KERNEL": kernel}


def launch_command(
    python: str, info: ConnectionInfo, state_dir: str, kernel: str = IPYTHON_KERNEL
) -> tuple[list[str], dict[str, str]]:
    """The container's command and the environment that carries the connection info.

    The command is the :mod:`~kernel_sandbox.kernel.supervisor` (with ``ipc``, after
    :data:`BINDER`), which keeps its status in ``state_dir`` and runs the kernel
    (kernelspec ``kernel``, see :func:`kernel_command`), again after each restart, with
    the same environment.  Nothing is written to disk on the host, so the tcp command
    works on a remote engine where no directory can be shared.
    """
    command = ["sh", "-c", SUPERVISOR, "kernel-sandbox-supervisor", state_dir]
    program, env = kernel_command(python, kernel)
    if info["transport"] == "ipc":
        # isolated and without site: the binder needs no package and no user setting
        command = [python, "-I", "-S", "-c", BINDER, *command[1:]]
        env["KERNEL_SANDBOX_SOCKETS"] = ",".join(
            f"{info['ip']}-{info[name]}"  # type: ignore[literal-required]
            for name in PORT_NAMES
        )
    info = {**info, "kernel_name": kernel}
    return [*command, *program], {**env, "KERNEL_SANDBOX_CONNECTION": json.dumps(info)}
