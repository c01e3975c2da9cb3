"""The egress proxy on its unix socket, with counting resolver and connector seams.

Nothing here leaves the machine: allowed destinations are "connected" by a connector
that opens a loopback server instead, and every refusal is checked to have cost no
resolution and no connection at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import textwrap
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kernel_sandbox.backends.docker.egress import EgressLimits, EgressProxy
from kernel_sandbox.network import Decision, EgressPolicy
from tests.waiting import await_for


@dataclass
class Network:
    """A fake outside world: names resolve from a table, connections go to loopback."""

    names: dict[str, list[str]]
    upstream_port: int = 0
    resolved: list[str] = field(default_factory=list)
    connected: list[tuple[str, int]] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)

    async def resolve(self, host: str, port: int) -> list[str]:
        self.resolved.append(host)
        if host not in self.names:
            raise OSError(f"unknown name {host}")
        return self.names[host]

    async def connect(
        self, address: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.connected.append((address, port))
        return await asyncio.open_connection("127.0.0.1", self.upstream_port)


async def _upstream(net: Network) -> asyncio.AbstractServer:
    """Echoes a tunnel's bytes back upper-cased; answers a forwarded GET."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(65536)
        net.received.append(first)
        if first.startswith(b"GET "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        else:
            while first:
                writer.write(first.upper())
                await writer.drain()
                first = await reader.read(65536)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    net.upstream_port = server.sockets[0].getsockname()[1]
    return server


@pytest.fixture
async def net() -> AsyncIterator[Network]:
    network = Network({"pkg.example.org": ["198.51.100.7"], "rebind.example.org": ["127.0.0.1"]})
    server = await _upstream(network)
    yield network
    server.close()


async def _proxy(
    tmp_path: Path, net: Network, patterns: list[str], **limits: object
) -> EgressProxy:
    refused: list[Decision] = []
    proxy = EgressProxy(
        EgressPolicy.from_patterns("test-policy", patterns),
        tmp_path / "proxy.sock",
        limits=EgressLimits(**limits),  # type: ignore[arg-type]
        resolver=net.resolve,
        connector=net.connect,
        on_refusal=refused.append,
    )
    proxy.refused = refused  # type: ignore[attr-defined]
    await proxy.start()
    return proxy


async def _request(
    proxy: EgressProxy, head: bytes
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    writer.write(head)
    await writer.drain()
    status = await reader.readuntil(b"\r\n\r\n")
    return status, reader, writer


@pytest.mark.parametrize(
    "target, resolutions",
    [
        ("outside.example.net:443", 0),  # a host outside the policy: not even resolved
        ("10.1.2.3:443", 0),  # a private address
        ("127.0.0.1:443", 0),  # the host's loopback
        ("[::1]:443", 0),
        ("169.254.169.254:80", 0),  # a cloud metadata service
        ("rebind.example.org:443", 1),  # a listed name that resolves to loopback
        ("pkg.example.org:22", 0),  # a listed name on a port that is not
    ],
)
async def test_refusals_send_no_traffic(
    tmp_path: Path, net: Network, target: str, resolutions: int
) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org", "rebind.example.org"])
    try:
        head, reader, writer = await _request(
            proxy, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
        )
        body = await reader.read()
        writer.close()
    finally:
        await proxy.close()
    assert head.startswith(b"HTTP/1.1 403 refused by the sandbox's network policy (test-policy)")
    assert b"allowed: pkg.example.org, rebind.example.org" in body
    assert net.connected == []  # no outgoing connection was attempted
    assert len(net.resolved) == resolutions
    assert [d.allowed for d in proxy.decisions] == [False]
    assert proxy.refused == list(proxy.decisions)  # type: ignore[attr-defined]


async def test_plain_http_refused_without_traffic(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"])
    try:
        head, _reader, writer = await _request(
            proxy, b"GET http://127.0.0.1:8080/admin HTTP/1.1\r\n\r\n"
        )
        writer.close()
    finally:
        await proxy.close()
    assert head.startswith(b"HTTP/1.1 403 ") and b"private or loopback" in head
    assert net.connected == [] and net.resolved == []


async def test_connect_tunnels_end_to_end_to_the_checked_address(
    tmp_path: Path, net: Network
) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org:443"])
    try:
        head, reader, writer = await _request(
            proxy, b"CONNECT pkg.example.org:443 HTTP/1.1\r\n\r\n"
        )
        assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
        writer.write(b"client hello")
        await writer.drain()
        assert await reader.readexactly(12) == b"CLIENT HELLO"
        writer.close()
    finally:
        await proxy.close()
    assert net.connected == [("198.51.100.7", 443)]  # the address that was checked
    assert proxy.decisions[-1].allowed and proxy.decisions[-1].detail == "198.51.100.7"
    assert proxy.bytes_relayed == 24


async def test_plain_http_is_forwarded_in_origin_form(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"])
    try:
        head, reader, writer = await _request(
            proxy,
            b"GET http://pkg.example.org/simple/six/?x=1 HTTP/1.1\r\nHost: other.example.net\r\n"
            b"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\r\n",
        )
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await reader.read() == b"hello"
        writer.close()
    finally:
        await proxy.close()
    sent = net.received[0]
    assert sent.startswith(b"GET /simple/six/?x=1 HTTP/1.1\r\n")
    assert b"\r\nHost: pkg.example.org\r\n" in sent and b"Connection: close" in sent
    assert b"other.example.net" not in sent  # the Host that was checked, not the one sent
    assert b"Proxy-" not in sent


async def test_a_listed_private_network_is_reachable(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["10.0.0.0/8"])
    try:
        head, _, writer = await _request(proxy, b"CONNECT 10.1.2.3:443 HTTP/1.1\r\n\r\n")
        writer.close()
    finally:
        await proxy.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert net.connected == [("10.1.2.3", 443)]


async def test_byte_cap_cuts_the_tunnel_and_refuses_more(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"], max_bytes=10_000)
    try:
        head, reader, writer = await _request(
            proxy, b"CONNECT pkg.example.org:443 HTTP/1.1\r\n\r\n"
        )
        assert head.startswith(b"HTTP/1.1 200")
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            for _ in range(100):
                writer.write(b"x" * 1000)
                await writer.drain()
                await reader.readexactly(1000)
        writer.close()
        head, _, writer = await _request(proxy, b"CONNECT pkg.example.org:443 HTTP/1.1\r\n\r\n")
        writer.close()
    finally:
        await proxy.close()
    assert head.startswith(b"HTTP/1.1 403") and b"10,000 bytes" in head
    assert proxy.bytes_relayed <= 10_000 + 65536


async def test_oversized_and_malformed_heads(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"], max_head_bytes=1024)
    try:
        head, _, writer = await _request(
            proxy, b"GET http://pkg.example.org/ HTTP/1.1\r\nX: " + b"a" * 4096 + b"\r\n\r\n"
        )
        writer.close()
        assert head.startswith(b"HTTP/1.1 431")
        head, _, writer = await _request(proxy, b"GET https://pkg.example.org/ HTTP/1.1\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.1 400")
        head, _, writer = await _request(proxy, b"hello\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.1 400")
        head, _, writer = await _request(
            proxy, b"CONNECT x.org:" + b"9" * 600 + b" HTTP/1.1\r\n\r\n"
        )
        writer.close()
        assert head.startswith(b"HTTP/1.1 400")
    finally:
        await proxy.close()
    assert net.connected == []
    assert len(proxy.decisions) == 4 and not any(d.allowed for d in proxy.decisions)


async def test_connection_caps(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(
        tmp_path, net, ["pkg.example.org"], max_connections=3, max_total_connections=5
    )
    try:
        held = [await asyncio.open_unix_connection(str(proxy.socket_path)) for _ in range(3)]
        await await_for(lambda: proxy.active_connections == 3, 30, 0.01, "3 connections")
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        assert await reader.read() == b""  # closed at once, nothing read or answered
        for _, w in held:
            w.close()
        await await_for(lambda: not proxy.active_connections, 30, 0.01, "them to be closed")
        for _ in range(2):
            head, _, writer = await _request(proxy, b"CONNECT pkg.example.org:443 HTTP/1.1\r\n\r\n")
            writer.close()
            assert head.startswith(b"HTTP/1.1 200")
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        assert await reader.read() == b""  # the sixth connection of the sandbox's life
    finally:
        await proxy.close()
    caps = [d.detail for d in proxy.decisions if "connection cap" in d.detail]
    assert len(caps) == 1 and "1 connections closed unread" in caps[0]  # a flood logs little


_FLOOD = textwrap.dedent(
    """
    import socket, sys, threading
    path, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    chunk = b"X-Flood: " + b"a" * 65536
    def one():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            sent = 0
            while sent < size:
                sent += s.send(chunk)
        except OSError:
            pass
        finally:
            s.close()
    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads: t.start()
    for t in threads: t.join()
    """
)


async def test_memory_stays_bounded_under_a_flood(tmp_path: Path, net: Network) -> None:
    """200 clients each try to push 4 MiB of request head: 800 MiB if the proxy kept it."""
    proxy = await _proxy(
        tmp_path, net, ["pkg.example.org"], max_connections=16, max_head_bytes=16 * 1024
    )
    tracemalloc.start()
    try:
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FLOOD, str(proxy.socket_path), "200", str(4 * 1024**2)
        )
        peak_active = 0
        while flood.returncode is None:
            peak_active = max(peak_active, proxy.active_connections)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(flood.wait(), 0.01)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await proxy.close()
    assert flood.returncode == 0
    assert peak_active <= 16
    assert peak < 32 * 1024**2, f"the proxy held {peak:,} bytes at its peak"
    assert net.connected == [] and net.resolved == []


async def test_close_cuts_open_tunnels_and_removes_the_socket(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"])
    head, reader, _writer = await _request(proxy, b"CONNECT pkg.example.org:443 HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    await proxy.close()
    assert await reader.read() == b""
    assert not proxy.socket_path.exists()
    await proxy.close()  # twice is fine


async def test_names_from_the_sandbox_are_logged_plain_and_short(
    tmp_path: Path, net: Network
) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"])
    try:
        target = "<img/src=x/onerror=alert(1)>" + "a" * 1000
        head, _, writer = await _request(
            proxy, f"CONNECT {target}.org:443 HTTP/1.1\r\n\r\n".encode()
        )
        writer.close()
    finally:
        await proxy.close()
    assert head.startswith(b"HTTP/1.1 403")
    decision = proxy.decisions[-1]
    assert decision.host.startswith("?img/src=x/onerror=alert(1)?aaa") and len(decision.host) <= 258
    assert "<" not in decision.detail and len(decision.detail) <= 703


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://pkg.example.org/ HTTP/1.1\r\nX: a\nHost: evil.example\r\n\r\n",  # bare LF
        b"GET http://pkg.example.org/ HTTP/1.1\r\nX: a\rY: b\r\n\r\n",  # bare CR
        b"GET http://pkg.example.org/ HTTP/1.1\nX: a\r\n\r\n",
        b"POST http://pkg.example.org/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST http://pkg.example.org/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 9\r\n\r\n",
    ],
)
async def test_smuggling_shaped_heads_are_refused_unforwarded(
    tmp_path: Path, net: Network, head: bytes
) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"])
    try:
        answer, _, writer = await _request(proxy, head)
        writer.close()
    finally:
        await proxy.close()
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 411")), answer
    assert net.connected == [] and net.received == []


async def test_a_pipelined_request_never_reaches_the_upstream(tmp_path: Path, net: Network) -> None:
    proxy = await _proxy(tmp_path, net, ["pkg.example.org"])
    second = b"GET http://pkg.example.org/admin HTTP/1.1\r\nHost: internal\r\n\r\n"
    try:
        answer, reader, writer = await _request(
            proxy,
            b"POST http://pkg.example.org/up HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody" + second,
        )
        echoed = answer + await reader.read()  # this upstream echoes what it got, upper-cased
        writer.close()
    finally:
        await proxy.close()
    assert echoed.startswith(b"POST /UP HTTP/1.1\r\n") and echoed.endswith(b"BODY")
    assert b"/ADMIN" not in echoed and b"/admin" not in b"".join(net.received)


async def test_a_host_name_with_a_64_character_label_is_a_clean_refusal(
    tmp_path: Path, net: Network, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await _proxy(tmp_path, net, ["*.example.org"])
    label = "a" * 64
    try:
        with caplog.at_level("WARNING"):
            for _ in range(20):
                answer, _, writer = await _request(
                    proxy, f"CONNECT {label}.example.org:443 HTTP/1.1\r\n\r\n".encode()
                )
                writer.close()
    finally:
        await proxy.close()
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403", b"HTTP/1.1 502")), answer
    assert not any(record.exc_info for record in caplog.records)
    assert sum(len(record.getMessage()) for record in caplog.records) < 20 * 400
