"""One sandbox's egress on the host (directory, socket, CA, settings) and the relay
program, run here on the host's loopback against a unix-socket stand-in for the proxy."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sandbox import rundirs
from kernel_sandbox.backends.docker.egress import CONTAINER_EGRESS_DIR, SandboxEgress
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.limits import EGRESS_CA_BYTES, EGRESS_PENDING_REFUSALS


async def test_egress_directory_socket_ca_and_settings(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    directory = tmp_path / "box.egress"
    egress = SandboxEgress(["files.example.org"], directory, str(ca))
    await egress.start()
    try:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
        sock = directory / "proxy.sock"
        assert sock.is_socket() and stat.S_IMODE(sock.stat().st_mode) == 0o666
        assert (directory / "ca.pem").read_text() == ca.read_text()
        assert rundirs.is_claimed(directory)  # gc leaves a live sandbox's directory alone
        assert egress.mount() == {str(directory): {"bind": CONTAINER_EGRESS_DIR, "mode": "ro"}}
        env = egress.environment()
        assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:3128"
        assert env["PIP_CERT"] == env["REQUESTS_CA_BUNDLE"] == f"{CONTAINER_EGRESS_DIR}/ca.pem"
        assert env["PIP_USER"] == "1"
        assert "PIP_INDEX_URL" not in env  # the list does not name the package index
        wrapped = egress.wrap_command(["supervisor", "--x"], "/opt/venv/bin/python")
        assert wrapped[:2] == ["/bin/sh", "-c"] and wrapped[-2:] == ["supervisor", "--x"]
    finally:
        await egress.close()
    assert not directory.exists()
    await egress.close()  # twice is fine


async def test_a_bad_ca_bundle_is_a_config_error_and_leaves_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "box.egress"
    egress = SandboxEgress(["files.example.org"], directory, str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="ca_bundle="):
        await egress.start()
    assert not directory.exists()
    huge = tmp_path / "huge.pem"
    with huge.open("wb") as f:
        f.truncate(EGRESS_CA_BYTES + 1)  # sparse: costs the test nothing
    egress = SandboxEgress(["files.example.org"], directory, str(huge))
    with pytest.raises(ConfigError, match="is larger than 16 MiB"):
        await egress.start()
    assert not directory.exists()


async def test_refusals_waiting_to_be_reported_are_capped(tmp_path: Path) -> None:
    egress = SandboxEgress(["files.example.org"], tmp_path / "box.egress", None)
    await egress.start()
    try:
        for i in range(3 * EGRESS_PENDING_REFUSALS):  # nobody takes them meanwhile
            reader, writer = await asyncio.open_unix_connection(egress.host_dir / "proxy.sock")
            writer.write(f"CONNECT denied{i}.example:443 HTTP/1.1\r\n\r\n".encode())
            await writer.drain()
            assert b" 403 " in await reader.readline()
            writer.close()
        taken = egress.take_refusals()
        assert len(taken) == EGRESS_PENDING_REFUSALS  # the latest ones; older were dropped
        last = f"denied{3 * EGRESS_PENDING_REFUSALS - 1}."
        assert last in str(taken[-1]) and "denied0." not in str(taken)
    finally:
        await egress.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_relay_forwards_to_the_socket_and_starts_once(tmp_path: Path) -> None:
    path = tmp_path / "proxy.sock"
    received: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readuntil(b"\r\n\r\n")
        received.append(data)
        writer.write(b"HTTP/1.1 403 nope\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(proxy, path=str(path))
    port = _free_port()
    argv = [*SandboxEgress.relay_command(sys.executable)[:-1], f"tcp:127.0.0.1:{port}=unix:{path}"]
    first = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=30
    )
    pid = int(first.stdout.split()[-1])
    try:
        assert first.returncode == 0 and "listening" in first.stdout
        again = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=30
        )
        assert again.returncode == 0 and "already listening" in again.stdout
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"CONNECT files.example.org:443 HTTP/1.1\r\n\r\n")
        await writer.drain()
        assert await reader.read() == b"HTTP/1.1 403 nope\r\n\r\n"
        writer.close()
        assert received == [b"CONNECT files.example.org:443 HTTP/1.1\r\n\r\n"]
    finally:
        os.kill(pid, signal.SIGKILL)
        server.close()
