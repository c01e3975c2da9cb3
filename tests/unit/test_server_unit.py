"""The server's edges without an engine: keys, 401 on every route, 413, policy, parity."""

from __future__ import annotations

import inspect

import httpx2
import pytest

from kernel_sandbox import AsyncFiles, AsyncSandbox
from kernel_sandbox.client.remote import RemoteFiles, RemoteSandbox
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.limits import DRAIN_BYTES
from kernel_sandbox.server.app import build_app
from kernel_sandbox.server.auth import COOKIE, Keyring, key_id
from kernel_sandbox.server.limits import is_upload_path
from kernel_sandbox.server.policy import client_config
from kernel_sandbox.server.settings import ServerSettings

KEYS = ("key-a", "key-b")
MiB = 1024**2
#: Engine-side attributes a remote handle cannot have (the container is on the server).
#: Plumbing of sandboxes in this process (pools, attach) that a remote one has no use for.
LOCAL_ONLY = {"adopt", "host", "labels", "connection_info", "retire", "warm_up"}
# contexts as values held here (a remote client asks with list_contexts)
LOCAL_ONLY |= {"default_context", "get_context", "known_languages"}
# what a local sandbox's kernels told it at their start (held here, no call: a remote
# client asks with kernelspecs; notebooks of a remote sandbox describe its kernel)
LOCAL_ONLY |= {"known_kernelspecs", "kernel_info"}
#: What only a remote sandbox can do.
REMOTE_ONLY = {"notebook", "url", "connect"}  # connect: a sandbox on a server, by url


def _client(settings: ServerSettings) -> httpx2.AsyncClient:
    # no lifespan: the auth and size checks come before any sandbox exists
    app = build_app(settings)
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1")


def test_keys_are_known_by_id_and_both_headers_work() -> None:
    ring = Keyring(KEYS)
    assert ring.identify({"x-api-key": "key-a"}) == key_id("key-a")
    assert ring.identify({"authorization": "Bearer key-b"}) == key_id("key-b")
    assert ring.identify({"x-api-key": "key-c"}) is None
    assert ring.identify({"authorization": "Basic key-a"}) is None
    assert ring.identify({}) is None
    assert "key-a" not in key_id("key-a") and len(key_id("key-a")) == 16


async def test_docs_open_in_a_browser_with_the_key_in_the_query() -> None:
    async with _client(ServerSettings(api_keys=KEYS)) as client:
        assert (await client.get("/docs")).status_code == 401
        assert (await client.get("/docs?api_key=wrong")).status_code == 401
        moved = await client.get("/docs?api_key=key-a")
        assert moved.status_code == 303 and moved.headers["location"] == "/docs"
        session = moved.cookies[COOKIE]
        assert "key-a" not in session and key_id("key-a") in session  # a signed id
        page = await client.get("/docs")
        assert page.status_code == 200 and "key-a" not in page.text
        assert "/docs/assets/swagger-ui-bundle.js" in page.text and "cdn" not in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        bundle = await client.get("/docs/assets/swagger-ui-bundle.js")
        assert bundle.status_code == 200 and "SwaggerUIBundle" in bundle.text
        assert (await client.get("/openapi.json")).status_code == 200  # the cookie's GET
        assert (await client.get("/docs/assets/index.html")).status_code == 404


def test_no_key_on_a_public_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="without an API key"):
        ServerSettings(host="0.0.0.0").check_bind()
    ServerSettings(host="0.0.0.0", api_keys=("k",)).check_bind()
    ServerSettings(host="127.0.0.1").check_bind()
    ServerSettings(host="::1").check_bind()


async def test_every_route_answers_401_without_the_right_key() -> None:
    settings = ServerSettings(api_keys=KEYS)
    async with _client(settings) as client:
        spec = (await client.get("/openapi.json", headers={"X-API-Key": "key-a"})).json()
        routes = [
            (method.upper(), path.replace("{sandbox_id}", "abc"))
            for path, methods in spec["paths"].items()
            for method in methods
        ]
        routes += [("GET", "/docs"), ("GET", "/openapi.json"), ("POST", "/mcp"), ("GET", "/nope")]
        assert len(routes) > 25
        routes += [("POST", "/e2b/sandbox/process.Process/List")]
        for method, path in routes:
            for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
                response = await client.request(method, path, headers=headers)
                if path.startswith("/e2b/sandbox/"):
                    # calls into an E2B sandbox carry its access token, not a key: no
                    # sandbox by that id (no token, a malformed body) is all they learn
                    refused = (401, 415, 422, 502, 503)
                    assert response.status_code in refused, (method, path, headers)
                    continue
                assert response.status_code == 401, (method, path, headers)
                body = response.json()
                if path.startswith("/e2b/"):  # E2B's error shape, the only one its SDK reads
                    assert body["code"] == 401 and "API key" in body["message"], (path, body)
                else:
                    assert "API key" in body["detail"]


async def test_oversized_bodies_get_413_before_any_route_runs() -> None:
    settings = ServerSettings(api_keys=KEYS, max_request_bytes=2048, max_upload_bytes=4096)
    headers = {"X-API-Key": "key-a", "content-type": "application/json"}
    async with _client(settings) as client:
        big = b'{"code": "' + b"x" * 3000 + b'"}'
        for path in ("/sandbox/tool/execute", "/v1/sandboxes/abc/python", "/sandbox/create"):
            response = await client.post(path, content=big, headers=headers)
            assert response.status_code == 413, path

        async def chunked(n: int):  # no Content-Length: counted as it arrives
            for _ in range(n):
                yield b"x" * 1024

        response = await client.post("/sandbox/tool/execute", content=chunked(5), headers=headers)
        assert response.status_code == 413
    assert is_upload_path("/v1/sandboxes/x/file")
    assert is_upload_path("/sandbox/x/archive")
    assert not is_upload_path("/sandbox/tool/execute")


async def test_a_refused_body_is_drained_only_up_to_the_drain_cap() -> None:
    settings = ServerSettings(api_keys=KEYS, max_request_bytes=2048)
    headers = {"X-API-Key": "key-a", "content-type": "application/json"}
    sent = 0

    async def endless():  # a client that never stops sending
        nonlocal sent
        piece = b"x" * MiB
        while sent < 4 * DRAIN_BYTES:
            sent += len(piece)
            yield piece

    async with _client(settings) as client:
        response = await client.post("/sandbox/tool/execute", content=endless(), headers=headers)
    assert response.status_code == 413
    assert DRAIN_BYTES <= sent <= DRAIN_BYTES + 2 * MiB  # read and dropped, then no more


def test_policy_maps_ms_enclave_defaults_and_clamps_them() -> None:
    enclave_defaults = {
        "timeout": 30,
        "tools_config": ["python_executor", "notebook_executor"],
        "working_dir": "/sandbox",
        "env_vars": {},
        "resource_limits": {},
        "image": "python:3.11-slim",
        "entrypoint": None,
        "volumes": {},
        "ports": {},
        "network": "bridge",
        "memory_limit": "4g",
        "cpu_limit": 2.0,
        "network_enabled": True,
        "privileged": False,
        "remove_on_exit": True,
    }
    settings = ServerSettings(max_memory="1g", max_cpu=1.0)
    cfg, notes = client_config(enclave_defaults, settings)
    assert cfg.network_enabled is False and notes
    assert (cfg.memory_limit, cfg.cpu_limit, cfg.image) == ("1g", 1.0, "python:3.11-slim")
    assert set(cfg.tools_config) == {"python_executor"}
    opened, _ = client_config(enclave_defaults, ServerSettings(allow_network=True))
    assert opened.network_enabled is True
    with pytest.raises(ConfigError, match="host directories"):
        client_config({"volumes": {"/etc": {"bind": "/x"}}}, settings)
    with pytest.raises(ConfigError, match="privileged"):
        client_config({"privileged": True}, settings)
    with pytest.raises(ConfigError, match="not allowed"):
        client_config({"image": "evil"}, ServerSettings(allowed_images=("kernel-sandbox:*",)))
    with pytest.raises(ConfigError):
        client_config({"memory_limit": "lots"}, settings)
    with pytest.raises(ConfigError):
        client_config([1, 2], settings)


def _public(cls: type) -> dict[str, inspect.Signature | None]:
    names = {n for n in dir(cls) if not n.startswith("_")}
    out = {}
    for name in names:
        value = inspect.getattr_static(cls, name)
        func = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        out[name] = inspect.signature(func) if inspect.isfunction(func) else None
    return out


def test_remote_sandbox_has_the_local_api() -> None:
    local, remote = _public(AsyncSandbox), _public(RemoteSandbox)
    local_attrs = {"config", "id", "image", "files", "created_at", "listeners", "container_id"}
    assert (set(local) | local_attrs) - LOCAL_ONLY <= set(remote) | local_attrs
    for name, signature in local.items():
        if name in LOCAL_ONLY or signature is None or name == "create":
            continue
        assert name in remote, name
        assert list(signature.parameters) == list(remote[name].parameters), name  # type: ignore[union-attr]
    assert set(remote) - set(local) <= REMOTE_ONLY | {"closed"}
    files_local, files_remote = _public(AsyncFiles), _public(RemoteFiles)
    assert set(files_local) == set(files_remote)
    for name, signature in files_local.items():
        assert signature is not None and files_remote[name] is not None
        assert list(signature.parameters) == list(files_remote[name].parameters), name  # type: ignore[union-attr]


def test_a_file_operation_past_its_deadline_is_a_gateway_timeout() -> None:
    from kernel_sandbox.errors import FileOperationError, FileOperationTimeoutError
    from kernel_sandbox.server.deps import status_of

    assert status_of(FileOperationTimeoutError("the sandbox's helper took 60 s")) == 504
    assert status_of(FileOperationError("no such directory")) == 400  # still the caller's
