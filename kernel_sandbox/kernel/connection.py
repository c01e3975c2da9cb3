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

from .supervisor import SUPERVISOR

__all__ = [
    "BINDER",
    "CONTAINER_RUN_DIR",
    "LAUNCHER",
    "ConnectionInfo",
    "free_tcp_ports",
    "ipc_socket_names",
    "launch_command",
    "new_connection_info",
]

#: Where the per-sandbox run directory is mounted inside the container.
CONTAINER_RUN_DIR = "/run/kernel-sandbox"
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")

# With ipc, the container's main process until it execs the supervisor: it binds the
# kernel's five unix sockets once, while the host keeps the run directory open, and
# hands the listening descriptors down.  The supervisor holds them across kernel
# restarts and every kernel listens on them (ZMQ_USE_FD), so no restart needs write
# access to the run directory: the host seals it for the container's life.  The sockets
# must be connectable by whichever host user drives the sandbox, so they are bound with
# an open umask (the run directory's parent on the host is private to that user).
BINDER = """\
import json
import os
import socket
import sys

info = json.loads(os.environ["KERNEL_SANDBOX_CONNECTION"])
os.umask(0)
bound = []
for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
    path = "%s-%s" % (info["ip"], info[name])
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(128)
    s.set_inheritable(True)
    bound.append("ipc://%s=%d" % (path, s.detach()))
os.umask(0o022)
os.environ["KERNEL_SANDBOX_FDS"] = ",".join(bound)
os.execvp("sh", ["sh"] + sys.argv[1:])
"""

# Runs inside the container as the kernel (a child of the supervisor).
LAUNCHER = """\
import json
import os
import sys
import tempfile

import zmq

connection = os.environ.pop("KERNEL_SANDBOX_CONNECTION")
fd, path = tempfile.mkstemp(prefix="kernel-", suffix=".json")
os.write(fd, connection.encode())
os.close(fd)
# tcp: every socket the kernel binds is a CURVE server (encrypted; a peer must know the
# server's key), whichever ipykernel the image has.
curve = json.loads(connection).get("curve_secretkey", "").encode()
# ipc: bind to the sockets the binder made (see BINDER) instead of making new ones.
prebound = os.environ.pop("KERNEL_SANDBOX_FDS", "")
prebound = dict(item.rsplit("=", 1) for item in prebound.split(",") if item)

def _bind(self, addr, _bind=zmq.Socket.bind):
    if curve:
        self.curve_secretkey = curve
        self.curve_publickey = zmq.curve_public(curve)
        self.curve_server = True
    if addr in prebound:
        self.set(zmq.USE_FD, int(prebound[addr]))
    return _bind(self, addr)

zmq.Socket.bind = _bind
# Without debugpy ipykernel starts ~100 ms sooner (no debugger: nobody attaches one to a
# sandbox); user code can still import debugpy afterwards.
sys.modules["debugpy"] = None
from ipykernel.kernelapp import IPKernelApp

app = IPKernelApp.instance()
# No sqlite history (a thread plus a disk write per cell; In, Out and _ still work) and
# no fixed 0.5 ms sleep after each cell; debug records were built and dropped for
# every message.  Together about 3-4 ms of a print(1+1) round trip (bench/).
app.initialize(["-f", path, "--HistoryManager.enabled=False", "--IPythonKernel._execute_sleep=0"])
app.log.setLevel("WARNING")
# ipykernel sends what a stream got in 0.2 s as one message: a tight print loop made
# messages of hundreds of MB, held whole in the kernel and then on the host.  Here a
# stream flushes every 1 MiB and waits for the send, so messages stay small and a
# writer cannot outrun the sender (the host caps what it keeps: max_output_bytes).
from ipykernel.iostream import OutStream

def _bounded_write(self, string, _write=OutStream.write, _chunk=1 << 20):
    if not isinstance(string, str) or len(string) <= _chunk:
        written = _write(self, string)  # None in a forked child: keep that
        self._ks_pending = getattr(self, "_ks_pending", 0) + len(string)
        if self._ks_pending > _chunk:
            self._ks_pending = 0
            self.flush()
        return written
    for start in range(0, len(string), _chunk):
        _bounded_write(self, string[start : start + _chunk])
    return len(string)

OutStream.write = _bounded_write
del sys.modules["debugpy"]


# A cell that closes sys.stdout/sys.stderr or sets them to None (or anything without a
# write method) would break every later cell (IPython fails before running one and never
# replies).  After each cell such a stream is replaced by a fresh one; a stream the user
# swapped for a working object of their own is left alone.  A few attribute reads a cell.
def _restore_streams():
    from ipykernel.iostream import OutStream

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if getattr(stream, "closed", False) or not callable(getattr(stream, "write", None)):
            setattr(sys, name, OutStream(app.session, app.iopub_thread, name, watchfd=False))


app.shell.events.register("post_execute", _restore_streams)
# exit() and quit() would stop the kernel 0.1 s *after* it replied "ok", so the next call
# would find it dead and lose every variable; in a sandbox they keep the kernel, as
# exit(keep_kernel=True) does.
app.shell.ask_exit = lambda: None
os.unlink(path)
for module in os.environ.get("KERNEL_SANDBOX_PREIMPORT", "").split(","):
    if module:
        try:
            app.shell.run_cell("import " + module, store_history=False, silent=True)
        except Exception:
            pass
app.start()
"""


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


def launch_command(
    python: str, info: ConnectionInfo, state_dir: str
) -> tuple[list[str], dict[str, str]]:
    """The container's command and the environment that carries the connection info.

    The command is the :mod:`~kernel_sandbox.kernel.supervisor` (with ``ipc``, after
    :data:`BINDER`), which keeps its status in ``state_dir`` and runs the kernel, again
    after each restart, with the same environment.  Nothing is written to disk on the
    host, so the tcp command works on a remote engine where no directory can be shared.
    """
    command = ["sh", "-c", SUPERVISOR, "kernel-sandbox-supervisor", state_dir]
    if info["transport"] == "ipc":
        command = [python, "-c", BINDER, *command[1:]]
    return [*command, python, "-c", LAUNCHER], {"KERNEL_SANDBOX_CONNECTION": json.dumps(info)}
