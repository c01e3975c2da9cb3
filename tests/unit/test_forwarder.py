"""The in-sandbox forwarder as an exact-ready kernel's bridge, run here as a real
process: a unix socket carried to an abstract one, a dead bridge's socket replaced, a
live one left alone, and the stop the host runs before a checkpoint."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import threading
from pathlib import Path

from kernel_sandbox.backends.docker.checkpoints import stop_bridge_command
from kernel_sandbox.kernel.programs import program


def _echo(name: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind("\0" + name)
    server.listen()

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with client:
                client.sendall(b"echo:" + client.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    return server


def _start(path: Path, name: str, pidfile: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", program("forwarder.py"), "--pidfile", str(pidfile)]
    return subprocess.run(
        [*argv, f"unix:{path}=unix:@{name}"], capture_output=True, text=True, timeout=30
    )


def _ask(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        client.sendall(b"hi")
        return client.recv(100)


def test_the_bridge_carries_replaces_a_dead_one_and_stops(tmp_path: Path) -> None:
    name = f"kernel-sandbox-test-{secrets.token_hex(4)}"
    server = _echo(name)
    path, pidfile = tmp_path / "k-1", tmp_path / "bridge.pid"
    try:
        first = _start(path, name, pidfile)
        assert first.returncode == 0, first.stderr
        assert _ask(path) == b"echo:hi"
        again = _start(path, name, pidfile)  # a live bridge: left alone
        assert again.returncode == 0 and "already listening" in again.stdout
        pid = int(pidfile.read_text())
        stop = [*stop_bridge_command()[:-1], str(pidfile)]
        assert subprocess.run(stop, timeout=30).returncode == 0  # 0 once it is gone
        assert not pidfile.exists() and not Path(f"/proc/{pid}").exists()
        assert path.is_socket()  # a dead bridge's socket stays behind...
        third = _start(path, name, pidfile)  # ...and the next bridge replaces it
        assert third.returncode == 0, third.stderr
        assert _ask(path) == b"echo:hi"
        assert subprocess.run(stop, timeout=30).returncode == 0
        assert subprocess.run(stop, timeout=30).returncode == 0  # nothing to stop: fine
    finally:
        server.close()
