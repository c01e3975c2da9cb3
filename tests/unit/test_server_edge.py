"""The server's edge without an engine: JSON shape, 422s, Host, Origin, CSRF, sessions,
per-key caps.  The real app (``build_app``) in-process, no lifespan: every rule here
answers before a sandbox could exist."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx2
import pytest

from kernel_sandbox.limits import (
    MAX_422_ERRORS,
    MAX_422_TEXT,
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    SESSION_TTL,
    json_shape_error,
)
from kernel_sandbox.server import auth
from kernel_sandbox.server.app import build_app
from kernel_sandbox.server.auth import COOKIE, Credential, Keyring, key_id, read_credential
from kernel_sandbox.server.browser import allowed_hosts_for
from kernel_sandbox.server.settings import ServerSettings
from tests.waiting import await_for

KEYS = ("key-a", "key-b")
A = {"X-API-Key": "key-a"}
JSON = {**A, "content-type": "application/json"}


def _client(settings: ServerSettings, base: str = "http://127.0.0.1:8000") -> httpx2.AsyncClient:
    app = build_app(settings)
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=base)


def test_json_shape_is_judged_on_the_bytes_before_parsing() -> None:
    assert json_shape_error(b'{"code": "print(1)"}') is None
    assert json_shape_error(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is None
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    assert "deeper" in (json_shape_error(deep) or "")
    many = b"[" + b"{}," * MAX_JSON_VALUES + b"{}]"
    assert "values" in (json_shape_error(many) or "")
    strings = json.dumps(["a"] * (MAX_JSON_VALUES + 1)).encode()
    assert "values" in (json_shape_error(strings) or "")
    # brackets, commas and escaped quotes inside strings are text, not structure
    text = json.dumps({"content": 'a,[{"b"}],\\"' * (MAX_JSON_VALUES // 2)}).encode()
    assert json_shape_error(text) is None
    assert json_shape_error(json.dumps({"x": "[" * 1000}).encode()) is None


async def test_a_flood_of_values_is_refused_unparsed_and_a_422_never_echoes() -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        objects = b"[" + b"{}," * (2 * MAX_JSON_VALUES) + b"{}]"
        r = await client.post("/v1/sandboxes/nope/python", content=objects, headers=A)
        assert r.status_code == 413 and "unparsed" in r.json()["detail"]
        r = await client.post("/mcp", content=objects, headers=A)
        assert r.status_code == 413
        secret = "S3CRET" * 20_000  # 120 kB of input that must not come back
        body = {"code": 5, secret: secret, "timeout": secret}
        r = await client.post("/v1/sandboxes/nope/python", json=body, headers=A)
        assert r.status_code == 422 and len(r.content) < 2_000
        assert "S3CRET" * 40 not in r.text
        locs = [tuple(e["loc"][:2]) for e in r.json()["detail"]]
        assert ("body", "code") in locs and ("body", "timeout") in locs
        text = await client.post(
            "/v1/sandboxes/nope/python", content=secret, headers={**A, "content-type": "text/plain"}
        )
        assert text.status_code == 422 and "S3CRET" not in text.text


async def test_a_422_lists_a_bounded_number_of_errors_each_cut_short() -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        wrong = {f"k{i}": i for i in range(5 * MAX_422_ERRORS)}  # one error per variable
        r = await client.post("/v1/sandboxes", json={"env_vars": wrong}, headers=A)
        detail = r.json()["detail"]
        assert r.status_code == 422 and len(detail) == MAX_422_ERRORS + 1
        assert detail[-1] == {"type": "more", "loc": [], "msg": f"{4 * MAX_422_ERRORS} more"}
        r = await client.post("/v1/sandboxes", json={"x" * 5000: 1}, headers=A)
        (error,) = r.json()["detail"]
        assert r.status_code == 422 and error["loc"] == ["body", "x" * MAX_422_TEXT]


def test_loopback_binds_allow_loopback_names_and_others_allow_what_is_set() -> None:
    assert set(allowed_hosts_for("127.0.0.1", ())) == {"127.0.0.1", "localhost", "::1"}
    assert "::1" in allowed_hosts_for("::1", ())
    assert allowed_hosts_for("0.0.0.0", ()) == ("*",)
    assert allowed_hosts_for("127.0.0.1", ("Sandbox.Example",)) == ("sandbox.example",)


async def test_a_rebinding_host_and_a_foreign_origin_are_refused_on_every_path() -> None:
    async with _client(ServerSettings()) as keyless:  # keyless, on loopback
        assert (await keyless.get("/health")).status_code == 200
        for path in ("/health", "/v1/sandboxes", "/mcp", "/ui", "/docs"):
            r = await keyless.get(path, headers={"host": "evil.example:8000"})
            assert r.status_code == 421 and "--allowed-host" in r.json()["detail"], path
        for origin in ("http://evil.example", "http://127.0.0.1:3000", "null"):
            r = await keyless.post(
                "/v1/sandboxes",
                content="{}",
                headers={"origin": origin, "content-type": "text/plain"},
            )
            assert r.status_code == 403 and "cross-origin" in r.json()["detail"], origin
        same = await keyless.get("/v1/sandboxes", headers={"origin": "http://127.0.0.1:8000"})
        assert same.status_code == 200
    wider = ServerSettings(allowed_hosts=("sandboxes.internal",))
    async with _client(wider, "http://sandboxes.internal") as client:
        assert (await client.get("/health")).status_code == 200
        r = await client.get("/health", headers={"host": "127.0.0.1"})
        assert r.status_code == 421


async def test_every_response_says_nosniff_and_forbids_framing() -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        for r in (await client.get("/health", headers=A), await client.get("/health")):
            assert r.headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


async def _session(client: httpx2.AsyncClient, path: str = "/ui") -> str:
    moved = await client.get(f"{path}?api_key=key-a")
    assert moved.status_code == 303
    return str(moved.cookies[COOKIE])


async def test_the_cookie_is_a_signed_session_and_a_junk_key_never_replaces_it() -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        session = await _session(client)
        assert "key-a" not in session and session.startswith(key_id("key-a") + ".")
        page = await client.get("/ui")
        assert page.status_code == 200 and "key-a" not in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'nonce-" in csp and "frame-ancestors 'none'" in csp
        junk = await client.get("/ui?api_key=junk")
        assert junk.status_code == 401 and COOKIE not in junk.cookies
        assert client.cookies[COOKIE] == session
        assert (await client.get("/ui/list.json")).status_code == 200
        forged = session[:-1] + ("0" if session[-1] != "0" else "1")
        client.cookies.clear()
        client.cookies.set(COOKIE, forged)
        assert (await client.get("/ui/list.json")).status_code == 401
        client.cookies.clear()
        client.cookies.set(COOKIE, "key-a")  # the raw key is not a session
        assert (await client.get("/ui/list.json")).status_code == 401
    ring = Keyring(KEYS)
    expired = ring.new_session(key_id("key-a"), ttl=-1)
    assert ring.check(Credential(expired, "cookie")) is None
    assert (
        Keyring(("key-b",)).check(Credential(ring.new_session(key_id("key-a")), "cookie")) is None
    )


async def test_a_session_ends_after_its_time_to_live(monkeypatch: pytest.MonkeyPatch) -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        moved = await client.get("/ui?api_key=key-a")
        assert f"max-age={int(SESSION_TTL)}" in moved.headers["set-cookie"].lower()
    ring = Keyring(KEYS)
    session = ring.new_session(key_id("key-a"))
    assert ring.check(Credential(session, "cookie")) == key_id("key-a")
    later = time.time() + SESSION_TTL + 5
    monkeypatch.setattr(auth, "time", SimpleNamespace(time=lambda: later))
    assert ring.check(Credential(session, "cookie")) is None


def test_an_explicit_key_beats_the_cookie() -> None:
    cookie = {"cookie": f"{COOKIE}=abc"}
    assert read_credential(cookie) == Credential("abc", "cookie")
    assert read_credential(cookie, b"api_key=q") == Credential("q", "query")
    assert read_credential({**cookie, "x-api-key": "h"}, b"api_key=q") == Credential("h", "header")
    assert read_credential({"authorization": "Bearer b"}) == Credential("b", "header")


async def test_a_cookie_alone_changes_nothing_without_the_csrf_token() -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        await _session(client)
        page = (await client.get("/ui")).text
        for method, path in (
            ("POST", "/v1/sandboxes"),
            ("POST", "/v1/sandboxes/abc/interrupt"),
            ("DELETE", "/v1/sandboxes/abc"),
            ("POST", "/sandbox/abc/stop"),
            ("POST", "/mcp"),
        ):
            r = await client.request(
                method, path, content="{}", headers={"content-type": "text/plain"}
            )
            assert r.status_code == 403 and "CSRF" in r.json()["detail"], (method, path)
        assert "key-a" not in page
        docs = await client.get("/docs")  # a page whose requests change things
        token = docs.text.split('const csrf = "')[1].split('"')[0]
        assert len(token) == 32
        r = await client.post("/v1/sandboxes/abc/interrupt", headers={"x-csrf-token": token})
        assert r.status_code == 404  # past the guard: the sandbox is unknown
        r = await client.post("/v1/sandboxes/abc/interrupt", headers={"x-csrf-token": "0" * 32})
        assert r.status_code == 403
        # an API client's key is no cookie: nothing extra to send
        plain = httpx2.AsyncClient(transport=client._transport, base_url=str(client.base_url))
        async with plain:
            r = await plain.post("/v1/sandboxes/abc/interrupt", headers=A)
            assert r.status_code == 404


async def test_one_key_gets_429_past_its_calls_in_flight_and_others_do_not() -> None:
    settings = ServerSettings(api_keys=KEYS, max_calls_per_key=2)
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"code": '
        await release.wait()
        yield b'"1"}'

    async with _client(settings) as client:
        held = [
            asyncio.ensure_future(
                client.post("/v1/sandboxes/nope/python", content=slow_body(), headers=JSON)
            )
            for _ in range(2)
        ]

        async def refused() -> httpx2.Response | None:
            r = await client.get("/health", headers=A)
            return r if r.status_code == 429 else None

        r = await await_for(refused, 10, 0.01, "both calls to be in flight")
        assert "--max-calls-per-key" in r.json()["detail"]
        assert (await client.get("/health", headers={"X-API-Key": "key-b"})).status_code == 200
        release.set()
        assert [(await h).status_code for h in held] == [404, 404]
        assert (await client.get("/health", headers=A)).status_code == 200


@pytest.mark.parametrize("path", ["/v1/sandboxes/x/python?stream=true", "/mcp"])
async def test_one_key_gets_429_past_its_open_streams(path: str) -> None:
    settings = ServerSettings(api_keys=KEYS, max_streams_per_key=1)
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b"{"
        await release.wait()
        yield b"}"

    async with _client(settings) as client:
        method = "GET" if path == "/mcp" else "POST"
        opened = asyncio.ensure_future(
            client.post("/v1/sandboxes/x/python?stream=1", content=slow_body(), headers=A)
        )

        async def stream_open() -> bool:  # a GET: 405 until the stream is open
            probe = await client.get("/v1/sandboxes/x/python?stream=true", headers=A)
            return probe.status_code == 429

        await await_for(stream_open, 10, 0.01, "the stream to be open")
        r = await client.request(method, path, headers=A)
        assert r.status_code == 429 and "--max-streams-per-key" in r.json()["detail"]
        other = await client.get(
            "/v1/sandboxes/x/python?stream=true", headers={"X-API-Key": "key-b"}
        )
        assert other.status_code == 405  # another key's streams are its own
        release.set()
        await opened
