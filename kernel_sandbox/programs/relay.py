"""The kernel for any kernelspec but IPython's: the kernel, with a relay in front of it.

Started by the supervisor in place of ``launcher.py`` when the sandbox asks for another
kernel (``KERNEL_SANDBOX_KERNEL`` names its kernelspec in the image: ``ir``, ``deno``,
``bash``...).  The host-facing sockets are the relay's, made exactly as the launcher
makes ipykernel's: bound to the binder's unix sockets (ipc) or as CURVE servers (tcp),
with the same bounded send queues and a non-dropping iopub.  The kernel itself runs as
the relay's child, in the same process group (the supervisor's kill ends both), on
loopback ports of its own, and its messages pass through unchanged (the same HMAC key
signs them), so no kernel needs to know about prebound sockets or CURVE.

Interrupts honour the kernelspec's ``interrupt_mode``: an ``interrupt_request`` on
control (what the host sends at a timeout) and a SIGINT to this process (what the
host's interrupt sends) both become a SIGINT to the kernel for ``signal`` kernels, and
an ``interrupt_request`` for ``message`` kernels.  The relay exits with the kernel's
status, so the supervisor reports the kernel's own end (an OOM kill, a crash).  Runs
with the image's kernel Python, which has pyzmq and jupyter_client (ipykernel's).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

import zmq
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

#: Messages each host-facing socket queues for a host that reads slower than the kernel
#: sends (the launcher's ``SEND_QUEUE``): past it iopub waits, and the kernel's own
#: queue towards the relay fills and drops, inside the sandbox's memory.
SEND_QUEUE = 16
#: Seconds the relay waits for the kernel's iopub to carry a first message (it goes on
#: without it after that: the host's own start deadline judges the kernel).
IOPUB_DEADLINE = 60.0
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
DELIMITER = b"<IDS|MSG>"
#: The routing id of the relay's shell and stdin sockets: the same on both, so a
#: kernel's input_request (sent to the shell request's identities) finds its way back.
RELAY_ID = b"kernel-sandbox-relay"
#: Requests whose senders the relay remembers, to route the kernel's answers back.
ROUTES = 4096
#: Kernels (their kernel_info ``implementation``) that publish a request's outputs
#: beside their shell loop, so that its ``idle`` status may come before them: Deno's
#: iopub drainer is a task of its own.  Their ``idle`` is held until iopub has been
#: quiet LATE_QUIET seconds (LATE_LIMIT at most), so every client (jupyter_client's
#: execute_interactive, nbclient, jupyter_kernel_test) sees the outputs first, as the
#: protocol has them (limits.py's IN_SANDBOX mirrors the two bounds).
LATE_PUBLISHERS = frozenset({"Deno kernel"})
LATE_QUIET = 0.05
LATE_LIMIT = 1.0

info = json.loads(os.environ.pop("KERNEL_SANDBOX_CONNECTION"))
name = os.environ.pop("KERNEL_SANDBOX_KERNEL")
curve = info.get("curve_secretkey", "").encode()
_fds = os.environ.pop("KERNEL_SANDBOX_FDS", "")
prebound = dict(item.rsplit("=", 1) for item in _fds.split(",") if item)
try:
    spec = KernelSpecManager().get_kernel_spec(name)
except NoSuchKernel:
    known = ", ".join(sorted(KernelSpecManager().find_kernel_specs())) or "none"
    print(f"kernel-sandbox: no kernelspec {name!r} in this image (it has: {known})", flush=True)
    sys.exit(2)
message_mode = getattr(spec, "interrupt_mode", "signal") == "message"
key = info["key"].encode()
digest = getattr(hashlib, info.get("signature_scheme", "hmac-sha256").split("-", 1)[1])


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


inner = dict(zip(PORTS, _free_ports(len(PORTS))))
home = tempfile.mkdtemp(prefix="kernel-sandbox-relay-")
connection_file = os.path.join(home, "kernel.json")
with open(os.open(connection_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
    json.dump(
        {
            **inner,
            "transport": "tcp",
            "ip": "127.0.0.1",
            "key": info["key"],
            "signature_scheme": info.get("signature_scheme", "hmac-sha256"),
            "kernel_name": name,
        },
        f,
    )
fields = {"connection_file": connection_file, "resource_dir": spec.resource_dir}
fields["prefix"] = sys.prefix
argv = list(spec.argv)
for field, value in fields.items():  # as jupyter_client fills them in
    argv = [arg.replace("{" + field + "}", value) for arg in argv]
kernel = subprocess.Popen(argv, env={**os.environ, **spec.env}, stdin=subprocess.DEVNULL)

context = zmq.Context()


def _outer(kind: int, port: str) -> zmq.Socket[bytes]:
    s: zmq.Socket[bytes] = context.socket(kind)
    s.sndhwm = SEND_QUEUE
    if kind == zmq.XPUB and hasattr(zmq, "XPUB_NODROP"):
        s.setsockopt(zmq.XPUB_NODROP, 1)
    if curve:
        s.curve_secretkey = curve
        s.curve_publickey = zmq.curve_public(curve)
        s.curve_server = True
    if info["transport"] == "ipc":
        addr = f"ipc://{info['ip']}-{info[port]}"
    else:
        addr = f"tcp://{info['ip']}:{info[port]}"
    if addr in prebound:
        s.set(zmq.USE_FD, int(prebound[addr]))
    s.bind(addr)
    return s


def _inner(kind: int, port: str, routing_id: bytes | None = None) -> zmq.Socket[bytes]:
    s: zmq.Socket[bytes] = context.socket(kind)
    s.rcvhwm = s.sndhwm = SEND_QUEUE
    if routing_id is not None:
        s.routing_id = routing_id
    s.connect(f"tcp://127.0.0.1:{inner[port]}")
    return s


def _sign(parts: list[bytes]) -> bytes:
    mac = hmac.new(key, digestmod=digest)
    for part in parts:
        mac.update(part)
    return mac.hexdigest().encode()


def _message(msg_type: str, parent: dict[str, Any], content: dict[str, Any]) -> list[bytes]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "session": parent.get("session", "kernel-sandbox-relay"),
        "username": "kernel-sandbox",
        "date": datetime.now(timezone.utc).isoformat(),
        "version": "5.3",
    }
    parts = [json.dumps(p).encode() for p in (header, parent, {}, content)]
    return [DELIMITER, _sign(parts), *parts]


def _interrupt_kernel() -> None:
    if kernel.poll() is None:
        os.kill(kernel.pid, signal.SIGINT)


def _header(frames: list[bytes], at: int, index: int) -> dict[str, Any]:
    try:
        header = json.loads(frames[at + index])
    except (IndexError, ValueError):
        return {}
    return header if isinstance(header, dict) else {}


#: Who sent each recent request (its identity frames), by message id.
routes: OrderedDict[str, list[bytes]] = OrderedDict()


def _routed(outer: zmq.Socket[bytes], to_kernel: zmq.Socket[bytes], control: bool) -> None:
    """Relays shell, stdin or control with one identity towards the kernel.

    Kernels differ in how many identity frames they hand back (Deno's keeps only its
    peer's), so the relay sends the kernel none but its own, remembers each request's
    sender by message id (at most :data:`ROUTES`), and routes every reply and input
    request back by its parent's id.  On control, an interrupt request for a
    signal-mode kernel is answered here (after a SIGINT to the kernel).
    """
    poller = zmq.Poller()
    poller.register(outer, zmq.POLLIN)
    poller.register(to_kernel, zmq.POLLIN)
    last: list[bytes] = []
    while True:
        for sock, _ in poller.poll():
            frames = sock.recv_multipart()
            if DELIMITER not in frames:
                continue  # not a Jupyter message: nobody to route it to
            at = frames.index(DELIMITER)
            if sock is to_kernel:
                parent = _header(frames, at, 3)
                idents = routes.get(str(parent.get("msg_id")), last)
                if idents:
                    outer.send_multipart([*idents, *frames[at:]])
                continue
            header = _header(frames, at, 2)
            last = frames[:at]
            routes[str(header.get("msg_id"))] = last
            while len(routes) > ROUTES:
                routes.popitem(last=False)
            if control and not message_mode and header.get("msg_type") == "interrupt_request":
                _interrupt_kernel()
                reply = _message("interrupt_reply", header, {"status": "ok"})
                outer.send_multipart([*last, *reply])
                continue
            to_kernel.send_multipart(frames[at:])


def _proxy(frontend: zmq.Socket[bytes], backend: zmq.Socket[bytes] | None) -> None:
    """iopub as it comes (subscriptions back); without a backend, a heartbeat echo (it
    tells the relay is up; a dead kernel ends the relay)."""
    try:
        if backend is None:
            while True:
                frontend.send_multipart(frontend.recv_multipart())
        if late_publisher:
            _iopub_outputs_first(frontend, backend)
        zmq.proxy(frontend, backend)
    except zmq.ZMQError:
        pass  # the context ends with the process


def _status(frames: list[bytes]) -> tuple[str, str, str]:
    """(msg_type, parent msg_id, execution_state) of an iopub message ('' if none)."""
    if DELIMITER not in frames:
        return "", "", ""
    at = frames.index(DELIMITER)
    kind = str(_header(frames, at, 2).get("msg_type", ""))
    parent = str(_header(frames, at, 3).get("msg_id", ""))
    state = str(_header(frames, at, 5).get("execution_state", "")) if kind == "status" else ""
    return kind, parent, state


def _iopub_outputs_first(frontend: zmq.Socket[bytes], backend: zmq.Socket[bytes]) -> None:
    """iopub of a LATE_PUBLISHERS kernel: each ``idle`` waits for its request's outputs.

    Deno's outputs leave in the order the cell made them, and its ``execute_result``
    is the last: once a request's result has gone by, its ``idle`` goes at once (no
    quiet to wait for: an expression's round trip stays a few milliseconds).
    """
    poller = zmq.Poller()
    poller.register(frontend, zmq.POLLIN)
    poller.register(backend, zmq.POLLIN)
    held: list[bytes] | None = None
    held_parent, quiet, limit = "", 0.0, 0.0
    resulted = ""  # the request whose execute_result went by last
    while True:
        wait = None if held is None else max(0.0, min(quiet, limit) - time.monotonic())
        ready = dict(poller.poll(None if wait is None else int(wait * 1000) + 1))
        if frontend in ready:  # a subscription: to the kernel, as zmq.proxy does
            backend.send_multipart(frontend.recv_multipart())
        if backend in ready:
            frames = backend.recv_multipart()
            kind, parent, state = _status(frames)
            if held is not None and kind == "status":  # a new state: the held one first
                frontend.send_multipart(held)
                held = None
            if kind == "status" and state == "idle" and parent != resulted:
                held, held_parent = frames, parent
                quiet, limit = time.monotonic() + LATE_QUIET, time.monotonic() + LATE_LIMIT
                continue
            frontend.send_multipart(frames)
            if kind == "execute_result":
                resulted = parent
            if held is not None and parent == held_parent:
                quiet = time.monotonic() + LATE_QUIET
                if kind == "execute_result":  # its last output: the idle now
                    frontend.send_multipart(held)
                    held = None
        if held is not None and time.monotonic() >= min(quiet, limit):
            frontend.send_multipart(held)
            held = None


def _subscribed_iopub() -> tuple[zmq.Socket[bytes], bool]:
    """The kernel's iopub, subscribed to everything, once a message has come through it.

    A PUB drops what it publishes before a subscription reaches it, and the kernel may
    answer the host's first request before the relay's subscription has: the first
    cell's output was lost now and then (R, Deno).  So, as jupyter_client's nudge does,
    the relay asks ``kernel_info`` until iopub carries something, before its host-facing
    sockets exist (the host's requests wait in the prebound sockets meanwhile).  The
    probe's reply says whether the kernel is one of LATE_PUBLISHERS.
    """
    sub = _inner(zmq.XSUB, "iopub_port")
    sub.send(b"\x01")
    probe = _inner(zmq.DEALER, "shell_port")
    end = time.monotonic() + IOPUB_DEADLINE
    while time.monotonic() < end and kernel.poll() is None:
        # Never blocks (past SEND_QUEUE requests wait for a kernel not listening yet): a
        # kernel that dies starting must still end the relay below with its status.
        with contextlib.suppress(zmq.Again):
            probe.send_multipart(_message("kernel_info_request", {}, {}), zmq.NOBLOCK)
        if sub.poll(200):
            break
    late = False
    if probe.poll(2000):  # the first reply (the kernel has answered: iopub spoke)
        frames = probe.recv_multipart()
        if DELIMITER in frames:
            content = _header(frames, frames.index(DELIMITER), 5)
            late = content.get("implementation") in LATE_PUBLISHERS
    probe.close(linger=0)
    while sub.poll(0):  # the probe's own status messages
        sub.recv_multipart()
    return sub, late


iopub_from_kernel, late_publisher = _subscribed_iopub()
for port, control in (("shell_port", False), ("stdin_port", False), ("control_port", True)):
    pair = (_outer(zmq.ROUTER, port), _inner(zmq.DEALER, port, RELAY_ID), control)
    threading.Thread(target=_routed, args=pair, daemon=True).start()
for frontend, backend in (
    (_outer(zmq.XPUB, "iopub_port"), iopub_from_kernel),
    (_outer(zmq.REP, "hb_port"), None),
):
    threading.Thread(target=_proxy, args=(frontend, backend), daemon=True).start()
# The host's interrupt (a SIGINT to this process, the kernel's session leader).
if message_mode:
    requests = _inner(zmq.DEALER, "control_port")

    def _on_sigint(signum: int, frame: object) -> None:
        requests.send_multipart(_message("interrupt_request", {}, {}))
else:

    def _on_sigint(signum: int, frame: object) -> None:
        _interrupt_kernel()


signal.signal(signal.SIGINT, _on_sigint)
code = kernel.wait()
os.unlink(connection_file)
os.rmdir(home)
sys.stdout.flush()
# The kernel's own end, as the supervisor would have seen it (128 + signal).
os._exit(128 - code if code < 0 else code)
