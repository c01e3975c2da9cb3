"""One E2B command inside the sandbox: runs it and frames its output for the host.

Started by the host (``kernel_sandbox.server.e2b.process``) beside the kernel, as the
sandbox user, with one JSON argument: ``cmd``, ``args``, ``envs``, ``cwd``, ``pty``
(``[cols, rows]`` or null), ``stdin`` (whether the command gets a pipe) and ``ctl``
(a directory this program makes for its control FIFO).  It writes frames to stdout,
each ``kind`` (one byte) + length (4 bytes, big-endian) + payload:

* ``S`` the command's pid (decimal), once, first;
* ``O`` / ``E`` / ``P`` bytes of stdout / stderr / the terminal (at most 64 KiB each);
* ``X`` JSON ``{"exit_code", "exited", "status", "error"}``, once, last.

The host writes control lines to the FIFO ``<ctl>/ctl`` (one short ``exec`` each):
JSON ``{"stdin": base64}``, ``{"close": true}``, ``{"signal": N}`` (sent to the whole
process group) or ``{"resize": [cols, rows]}``.  Everything here runs as the sandbox
user: nothing it does reaches past the sandbox's own limits.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import termios
from typing import Any

CHUNK = 65536
#: Longest control line read; longer ones are dropped (the host sends <= 64 KiB + JSON).
MAX_LINE = 1 << 20


def frame(kind: bytes, payload: bytes) -> None:
    out = sys.stdout.buffer
    out.write(kind + struct.pack(">I", len(payload)) + payload)
    out.flush()


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def start(spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes], dict[int, bytes], int | None]:
    env = {**os.environ, **spec.get("envs", {})}
    argv = [spec["cmd"], *spec.get("args", [])]
    cwd = spec.get("cwd") or None
    if spec.get("pty"):
        master, slave = os.openpty()
        cols, rows = spec["pty"]
        set_size(slave, cols, rows)
        env.setdefault("TERM", "xterm-256color")

        def controlling_terminal() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        return proc, {master: b"P"}, master
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if spec.get("stdin") else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    return proc, {proc.stdout.fileno(): b"O", proc.stderr.fileno(): b"E"}, None


def control(line: bytes, proc: subprocess.Popen[bytes], master: int | None) -> None:
    try:
        message = json.loads(line)
    except ValueError:
        return
    if not isinstance(message, dict):
        return
    if "stdin" in message:
        data = base64.b64decode(str(message["stdin"]))
        target = master if master is not None else (proc.stdin.fileno() if proc.stdin else None)
        if target is not None:
            with contextlib.suppress(OSError):
                os.write(target, data)
    elif message.get("close") and proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    elif "signal" in message:
        with contextlib.suppress(OSError, ValueError, TypeError):
            os.killpg(proc.pid, int(message["signal"]))
    elif "resize" in message and master is not None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            cols, rows = message["resize"]
            set_size(master, int(cols), int(rows))
            os.killpg(proc.pid, signal.SIGWINCH)


def main() -> int:
    spec = json.loads(sys.argv[1])
    ctl_dir = spec["ctl"]
    os.makedirs(ctl_dir, mode=0o700, exist_ok=True)
    fifo = os.path.join(ctl_dir, "ctl")
    os.mkfifo(fifo, 0o600)
    ctl = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never EOF when a writer leaves
    try:
        proc, outputs, master = start(spec)
    except (OSError, ValueError) as exc:  # no such command; what exec cannot take
        frame(b"S", b"0")
        end = {"exit_code": -1, "exited": False, "status": "error", "error": str(exc)}
        frame(b"X", json.dumps(end).encode())
        shutil.rmtree(ctl_dir, ignore_errors=True)
        return 0
    frame(b"S", str(proc.pid).encode())
    selector = selectors.DefaultSelector()
    for fd in outputs:
        selector.register(fd, selectors.EVENT_READ)
    selector.register(ctl, selectors.EVENT_READ)
    pending = b""
    while outputs:
        for key, _ in selector.select():
            fd = int(key.fd)
            if fd == ctl:
                pending += os.read(ctl, CHUNK)
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    control(line, proc, master)
                if len(pending) > MAX_LINE:
                    pending = b""
                continue
            try:
                data = os.read(fd, CHUNK)
            except OSError:  # a terminal whose last writer closed answers EIO
                data = b""
            if data:
                frame(outputs[fd], data)
            else:
                selector.unregister(fd)
                del outputs[fd]
    code = proc.wait()
    shutil.rmtree(ctl_dir, ignore_errors=True)
    if code < 0:
        status = f"signal: {signal.Signals(-code).name.lower().removeprefix('sig')}"
        end = {"exit_code": -1, "exited": False, "status": status, "error": None}
    else:
        end = {"exit_code": code, "exited": True, "status": f"exit status {code}", "error": None}
    frame(b"X", json.dumps(end).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
