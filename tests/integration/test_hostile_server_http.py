"""A client as an attacker at the HTTP edge of a real ``kernel-sandbox serve``.

Each test is one class of attack (issue #22): JSON bodies that cost memory to parse,
half-sent request heads, a rebinding Host and foreign Origins, stalled event streams,
another key's MCP sessions.  Around each, :class:`Watch` measures what the server
spends (its resident memory and open descriptors) and what *another* tenant sees (key
B's ``/health``, polled throughout), and the test fails past the bounds below.  The
floods are scaled to run in seconds; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest

from kernel_sandbox.limits import MAX_REQUEST_BYTES
from tests.integration.serving import KEY_A, KEY_B, Server
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

#: The bounds every attack here must stay within (issue #22's spirit).
MAX_GROWTH_MB = 64
MAX_OTHER_HEALTH_S = 2.0
HEADER_TIMEOUT = 2.0
MAX_CONNECTIONS = 300
MiB = 1024 * 1024
CAP = MAX_REQUEST_BYTES


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        f"t-hostile-http-{os.getpid()}",
        tmp_path_factory.mktemp("nb"),
        [
            "--header-timeout", str(HEADER_TIMEOUT),
            "--max-connections", str(MAX_CONNECTIONS),
            "--max-mcp-sessions-per-key", "4",
        ],
    ).start()  # fmt: skip
    yield srv
    srv.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def reset_peak(pid: int) -> None:
    """Start the process's high-water mark of memory (VmHWM) afresh, at its RSS now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Watch:
    """The server's memory and descriptors, and key B's ``/health``, during an attack."""

    server: Server
    rss_before: float = 0.0
    fds_before: int = 0
    rss_peak: float = 0.0
    fds_peak: int = 0
    health: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def growth(self) -> float:
        return self.rss_peak - self.rss_before

    def check(self) -> None:
        """The bounds of the whole suite (the figures are printed for ``pytest -s``)."""
        print(
            f"\nserver +{self.growth:.0f} MB (from {self.rss_before:.0f}), fds peak "
            f"+{self.fds_peak - self.fds_before}, other tenant's /health max "
            f"{max(self.health):.3f} s over {len(self.health)} polls"
        )
        assert not self.failures, self.failures[:3]
        assert self.growth <= MAX_GROWTH_MB, f"server grew {self.growth:.0f} MB"
        worst = max(self.health)
        assert worst <= MAX_OTHER_HEALTH_S, f"another tenant's /health took {worst:.2f} s"


@contextlib.contextmanager
def watching(server: Server) -> Iterator[Watch]:
    assert server.proc is not None
    pid = server.proc.pid
    reset_peak(pid)  # the peak is then exact, however short (no sampling misses it)
    rss, fds = rss_mb(pid), open_fds(pid)
    watch = Watch(server, rss_before=rss, fds_before=fds, rss_peak=rss, fds_peak=fds)
    done = threading.Event()

    def poll() -> None:
        with httpx2.Client(base_url=server.url, headers={"X-API-Key": KEY_B}, timeout=30) as c:
            while not done.is_set():
                start = time.monotonic()
                try:
                    if c.get("/health").status_code != 200:
                        watch.failures.append("another tenant's /health failed")
                except httpx2.HTTPError as exc:
                    watch.failures.append(f"another tenant's /health: {exc!r}")
                watch.health.append(time.monotonic() - start)
                watch.fds_peak = max(watch.fds_peak, open_fds(pid))
                done.wait(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        done.set()
        thread.join(60)
    watch.rss_peak = peak_mb(pid)


def _post(server: Server, path: str, body: bytes, key: str = KEY_A) -> httpx2.Response:
    headers = {"X-API-Key": key, "content-type": "application/json"}
    return httpx2.post(server.url + path, content=body, headers=headers, timeout=120)


def test_json_floods_are_refused_unparsed_and_nothing_is_echoed(server: Server) -> None:
    objects = b"[" + b"{}," * ((CAP - 3) // 3 - 1) + b"{}]"  # just under the body cap
    junk = "x" * (CAP - 100)
    invalid = json.dumps({"code": 5, "timeout": junk}).encode()
    with watching(server) as watch:
        answers = []
        threads = [
            threading.Thread(
                target=lambda p=path, b=body: answers.append(_post(server, p, b)), daemon=True
            )
            for path, body in [
                ("/v1/sandboxes/nope/python", objects * 2),  # 16 MiB: refused by its length
                ("/v1/sandboxes/nope/python", objects),
                ("/v1/sandboxes/nope/python", objects),
                ("/mcp", objects),
                ("/v1/sandboxes/nope/python", invalid),
            ]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        alone = [_post(server, "/v1/sandboxes/nope/python", b) for b in (objects, invalid)]
    assert [r.status_code for r in alone] == [413, 422]  # one at a time: unparsed; named
    # side by side, a body past the key's budget (MAX_BODY_BYTES_PER_KEY) is refused too
    assert {r.status_code for r in answers} <= {413, 422, 429}, [r.status_code for r in answers]
    answers += alone
    assert all(len(r.content) < 4096 for r in answers), [len(r.content) for r in answers]
    assert "xxxxxxxx" not in "".join(r.text for r in answers)
    watch.check()


def test_half_sent_heads_are_cut_and_keyed_requests_keep_working(server: Server) -> None:
    heads: list[socket.socket] = []
    with watching(server) as watch:
        for _ in range(1500):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            heads.append(s)
        keyed = httpx2.get(f"{server.url}/health", headers={"X-API-Key": KEY_A}, timeout=30)
        assert keyed.status_code == 200
        wait_for(  # every head past its deadline was closed
            lambda: _open_from_server(heads) == 0,
            HEADER_TIMEOUT + 30,
            0.1,
            what="the server to close every head past its deadline",
        )
    for s in heads:
        s.close()
    held = watch.fds_peak - watch.fds_before
    assert held <= MAX_CONNECTIONS + 20, f"{held} more descriptors open during the flood"
    watch.check()


def _open_from_server(heads: list[socket.socket]) -> int:
    """How many of ``heads`` the server still holds open (a closed one reads EOF)."""
    open_ = 0
    for s in heads:
        s.setblocking(False)
        try:
            if s.recv(1):
                open_ += 1
        except BlockingIOError:
            open_ += 1
        except OSError:
            pass
    return open_


def test_a_huge_head_gets_431(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(200):
            try:
                s.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
            except OSError:
                break
        s.settimeout(10)
        reply = s.recv(200)
    assert reply.startswith(b"HTTP/1.1 431"), reply


def test_a_rebinding_page_and_another_origin_cannot_act(server: Server) -> None:
    """DNS rebinding (a foreign Host), another port's page (a foreign Origin), and a
    cookie-only ``text/plain`` change from it: all refused before any route runs."""
    rebound = httpx2.post(
        f"{server.url}/v1/sandboxes",
        content="{}",
        headers={"host": f"rebind.example:{server.port}", "X-API-Key": KEY_A},
    )
    assert rebound.status_code == 421
    with httpx2.Client(base_url=server.url, timeout=30) as browser:
        moved = browser.get("/ui", params={"api_key": KEY_A})
        assert moved.status_code == 303 and KEY_A not in moved.headers.get("set-cookie", "")
        for headers in (
            {"origin": "http://127.0.0.1:1", "content-type": "text/plain"},
            {"content-type": "text/plain"},  # same origin, but no CSRF token
        ):
            r = browser.post("/v1/sandboxes", content="{}", headers=headers)
            assert r.status_code == 403, (headers, r.text)
        assert browser.get("/v1/sandboxes").status_code == 200  # reading is allowed
        page = browser.get("/docs")
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"


MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "0"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _mcp_session(client: httpx2.Client, key: str) -> str:
    r = client.post("/mcp", json=MCP_INIT, headers={**MCP_HEADERS, "X-API-Key": key})
    assert r.status_code == 200, r.text
    return str(r.headers["mcp-session-id"])


def _mcp_ping(client: httpx2.Client, key: str, session: str) -> int:
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    headers = {
        **MCP_HEADERS,
        "X-API-Key": key,
        "mcp-session-id": session,
        "mcp-protocol-version": "2025-06-18",
    }
    return client.post("/mcp", json=ping, headers=headers).status_code


def test_mcp_sessions_answer_only_their_key_and_are_capped_per_key(server: Server) -> None:
    with httpx2.Client(base_url=server.url, timeout=30) as client:
        a = _mcp_session(client, KEY_A)
        assert _mcp_ping(client, KEY_A, a) == 200
        theirs = {"X-API-Key": KEY_B, "mcp-session-id": a, "accept": "text/event-stream"}
        assert client.get("/mcp", headers=theirs).status_code == 404
        assert client.delete("/mcp", headers=theirs).status_code == 404
        assert _mcp_ping(client, KEY_B, a) == 404
        assert _mcp_ping(client, KEY_A, a) == 200  # still A's, still alive
        with watching(server) as watch:
            opened = [_mcp_session(client, KEY_A) for _ in range(40)]
        alive = [s for s in [a, *opened] if _mcp_ping(client, KEY_A, s) == 200]
        assert alive == opened[-4:]  # the cap: the longest-idle ones were ended
        b = _mcp_session(client, KEY_B)  # another key is not affected by A's cap
        assert _mcp_ping(client, KEY_B, b) == 200
        watch.check()


#: Output of each call: small enough that the session notebook (which records every
#: output: its own cap is another class, item 6) stays out of this test's figure.
STREAM_MIB = 1


def _stalled_stream(server: Server, sandbox: str) -> tuple[socket.socket, bytes]:
    """A ``?stream=true`` call whose reader reads the status line, then nothing more."""
    code = (  # then a pause, so the stream stays open past the reader's socket buffers
        f"import time\nfor i in range({STREAM_MIB * 16}):\n    print('x' * 65535, flush=True)"
        "\ntime.sleep(3)"
    )
    body = json.dumps({"code": code}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(
        f"POST /v1/sandboxes/{sandbox}/python?stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"X-API-Key: {KEY_A}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    s.settimeout(120)
    return s, s.recv(12)


def test_stalled_event_streams_cost_their_own_calls_not_server_memory(
    server: Server, docker_engine
) -> None:  # type: ignore[no-untyped-def]
    with httpx2.Client(base_url=server.url, headers={"X-API-Key": KEY_A}, timeout=120) as a:
        sandbox = a.post("/v1/sandboxes", json={}).json()["id"]
        try:
            with watching(server) as watch:
                streams = [_stalled_stream(server, sandbox) for _ in range(12)]
                statuses = sorted(int(status[9:12]) for _, status in streams)
                assert statuses == [200] * 4 + [429] * 8, statuses

                def ran() -> bool:  # until the four calls ran, unread
                    row = a.get("/ui/list.json").json()["sandboxes"][0]
                    return bool(row["cells"] >= 4 and row["state"] == "idle")

                wait_for(ran, 180, 0.5, "the four streamed calls to run")
            watch.check()
            for s, _ in streams:
                s.close()

            def free() -> bool:  # the streams' places are free again
                again, status = _stalled_stream(server, sandbox)
                again.close()
                return status.endswith(b"200")

            wait_for(free, 30, 0.2, "a stream's place to be free again")
        finally:
            a.delete(f"/v1/sandboxes/{sandbox}")
