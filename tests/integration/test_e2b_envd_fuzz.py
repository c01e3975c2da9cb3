"""Bad input to envd's Connect routes (process, filesystem): Connect's answers only,
the server's memory bounded, the server still serving.

schemathesis (``test_server_fuzz.py``) sees what the OpenAPI document describes; envd's
routes speak Connect, which it does not.  Here hypothesis sends every process and
filesystem RPC bodies made from E2B's own messages (the modules generated from its
``.proto`` files): valid, then bit-flipped, truncated, grown or replaced, as protobuf and
as JSON (JSON of the wrong shape too), unary or in Connect's streaming envelope (a flags
byte and a 4-byte length) whose flags or length may lie, under content types and
``Connect-Timeout-Ms`` values right and wrong; then bodies past the server's request cap.

Every answer must be Connect's own: a response that decodes as the method's, or an error
in Connect's shape (``{"code", "message"}`` at the HTTP status Connect gives that code
for a unary call; an end-of-stream message for a stream), or 415 for a content type the
route does not speak.  An ``unknown`` error (an exception the server did not mean) fails,
as does an ``internal`` one other than the protocol's own ("protocol error: ...").
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protobuf import Message, Oneof

from kernel_sandbox.limits import MAX_REQUEST_BYTES
from kernel_sandbox.server.e2b.envd.filesystem import filesystem_pb as fs
from kernel_sandbox.server.e2b.envd.process import process_pb as pr
from tests.integration.serving import KEY_A, Server

pytestmark = pytest.mark.integration

#: Connect's HTTP status for each error code (connectrpc.com/docs/protocol, "Error Codes").
CONNECT_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
#: What a stream's answer is read up to (the commands fuzzed print little).
READ_CAP = 4 << 20
#: Growth of the server's resident memory over the whole run that counts as bounded: a
#: request body at the cap parsed whole costs about four times the body (limits.py).
RSS_GROWTH_CAP = 4 * MAX_REQUEST_BYTES


@dataclass(frozen=True)
class Rpc:
    path: str
    kind: str  # "unary", "server", "client" (streaming side)
    output: type[Message[Any]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    record = tmp_path_factory.mktemp("nb")
    srv = Server(
        f"t-envdfuzz-{os.getpid()}", record, log=record.with_name(f"{record.name}-server.log")
    ).start()
    yield srv
    srv.stop()


def rss(server: Server) -> int:
    """The server process's resident memory, in bytes."""
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# -- messages ------------------------------------------------------------------------
paths = st.one_of(
    st.sampled_from(
        ["fz", "fz/a", "fz/b/c", "/tmp/fz", "/", "/proc", "/dev/zero", "..", "fz/../..", ""]
    ),
    st.text(max_size=40),
)
uint32 = st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1))
selector = st.builds(
    pr.ProcessSelector,
    selector=st.one_of(
        st.builds(Oneof, st.just("pid"), uint32), st.builds(Oneof, st.just("tag"), st.text())
    ),
)
pty = st.builds(pr.PTY, size=st.builds(pr.PTY.Size, cols=uint32, rows=uint32))
process_input = st.builds(
    pr.ProcessInput,
    input=st.builds(Oneof, st.sampled_from(["stdin", "pty"]), st.binary(max_size=64)),
)
config = st.builds(
    pr.ProcessConfig,
    # commands that end by themselves (or at the call's timeout, for `sh` with stdin)
    cmd=st.one_of(st.sampled_from(["true", "echo", "ls", "sh", "/bin/false"]), st.text()),
    args=st.lists(st.text(max_size=20), max_size=3),
    envs=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
    cwd=st.one_of(st.none(), paths),
)
MESSAGES: dict[str, tuple[Rpc, st.SearchStrategy[Message[Any]]]] = {
    "List": (Rpc("process.Process/List", "unary", pr.ListResponse), st.just(pr.ListRequest())),
    "Start": (
        Rpc("process.Process/Start", "server", pr.StartResponse),
        st.builds(
            pr.StartRequest,
            process=config,
            pty=st.one_of(st.none(), pty),
            tag=st.one_of(st.none(), st.text(max_size=10)),
            stdin=st.one_of(st.none(), st.booleans()),
        ),
    ),
    "Connect": (
        Rpc("process.Process/Connect", "server", pr.ConnectResponse),
        st.builds(pr.ConnectRequest, process=selector),
    ),
    "Update": (
        Rpc("process.Process/Update", "unary", pr.UpdateResponse),
        st.builds(pr.UpdateRequest, process=selector, pty=st.one_of(st.none(), pty)),
    ),
    "StreamInput": (
        Rpc("process.Process/StreamInput", "client", pr.StreamInputResponse),
        st.builds(
            pr.StreamInputRequest,
            event=st.one_of(
                st.builds(
                    Oneof,
                    st.just("start"),
                    st.builds(pr.StreamInputRequest.StartEvent, process=selector),
                ),
                st.builds(
                    Oneof,
                    st.just("data"),
                    st.builds(pr.StreamInputRequest.DataEvent, input=process_input),
                ),
                st.just(Oneof("keepalive", pr.StreamInputRequest.KeepAlive())),
            ),
        ),
    ),
    "SendInput": (
        Rpc("process.Process/SendInput", "unary", pr.SendInputResponse),
        st.builds(pr.SendInputRequest, process=selector, input=process_input),
    ),
    "SendSignal": (
        Rpc("process.Process/SendSignal", "unary", pr.SendSignalResponse),
        st.builds(pr.SendSignalRequest, process=selector, signal=st.sampled_from(pr.Signal)),
    ),
    "CloseStdin": (
        Rpc("process.Process/CloseStdin", "unary", pr.CloseStdinResponse),
        st.builds(pr.CloseStdinRequest, process=selector),
    ),
    "Stat": (
        Rpc("filesystem.Filesystem/Stat", "unary", fs.StatResponse),
        st.builds(fs.StatRequest, path=paths),
    ),
    "MakeDir": (
        Rpc("filesystem.Filesystem/MakeDir", "unary", fs.MakeDirResponse),
        st.builds(fs.MakeDirRequest, path=paths),
    ),
    "Move": (
        Rpc("filesystem.Filesystem/Move", "unary", fs.MoveResponse),
        st.builds(fs.MoveRequest, source=paths, destination=paths),
    ),
    "ListDir": (
        Rpc("filesystem.Filesystem/ListDir", "unary", fs.ListDirResponse),
        st.builds(fs.ListDirRequest, path=paths, depth=uint32),
    ),
    "Remove": (
        Rpc("filesystem.Filesystem/Remove", "unary", fs.RemoveResponse),
        st.builds(fs.RemoveRequest, path=paths),
    ),
    "WatchDir": (
        Rpc("filesystem.Filesystem/WatchDir", "server", fs.WatchDirResponse),
        st.builds(fs.WatchDirRequest, path=paths, recursive=st.booleans()),
    ),
    "CreateWatcher": (
        Rpc("filesystem.Filesystem/CreateWatcher", "unary", fs.CreateWatcherResponse),
        st.builds(fs.CreateWatcherRequest, path=paths, recursive=st.booleans()),
    ),
    "GetWatcherEvents": (
        Rpc("filesystem.Filesystem/GetWatcherEvents", "unary", fs.GetWatcherEventsResponse),
        st.builds(fs.GetWatcherEventsRequest, watcher_id=st.text(max_size=40)),
    ),
    "RemoveWatcher": (
        Rpc("filesystem.Filesystem/RemoveWatcher", "unary", fs.RemoveWatcherResponse),
        st.builds(fs.RemoveWatcherRequest, watcher_id=st.text(max_size=40)),
    ),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@st.composite
def payloads(draw: st.DrawFn, message: Message[Any], codec: str) -> bytes:
    """The message's bytes in ``codec``, then maybe bit-flipped, cut, grown or replaced."""
    data = bytearray(message.to_binary() if codec == "proto" else message.to_json().encode())
    how = draw(st.sampled_from(["valid", "flip", "cut", "grow", "random", "shape"]))
    if how == "flip" and data:
        for bit in draw(st.lists(st.integers(0, len(data) * 8 - 1), min_size=1, max_size=8)):
            data[bit // 8] ^= 1 << (bit % 8)
    elif how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "grow":
        data += draw(st.binary(min_size=1, max_size=64))
    elif how == "random":
        data = bytearray(draw(st.binary(max_size=256)))
    elif how == "shape":  # JSON of the wrong shape: the message's keys, any values
        keys = list(json.loads(message.to_json()) or {"path": 0})
        value = draw(st.dictionaries(st.sampled_from(keys), json_values) | json_values)
        data = bytearray(json.dumps(value).encode())
    return bytes(data)


def envelope(flags: int, payload: bytes, length: int | None = None) -> bytes:
    """One message in Connect's streaming framing: flags, big-endian length, bytes."""
    return bytes([flags]) + struct.pack(">I", len(payload) if length is None else length) + payload


@dataclass(frozen=True)
class Call:
    rpc: Rpc
    content_type: str
    body: bytes
    timeout_ms: str
    spoken: bool  # the content type is one the route speaks


@st.composite
def calls(draw: st.DrawFn) -> Call:
    rpc, messages = MESSAGES[draw(st.sampled_from(sorted(MESSAGES)))]
    codec = draw(st.sampled_from(["proto", "json"]))
    payload = draw(payloads(draw(messages), codec))
    if rpc.kind == "unary":
        body, content_type = payload, f"application/{codec}"
    else:
        frames = [payload]
        if rpc.kind == "client":
            frames += draw(st.lists(payloads(draw(messages), codec), max_size=2))
        body = b""
        for frame in frames:
            flags = draw(st.sampled_from([0, 0, 0, 0, 1, 2, 0x80, 0xFF]))
            lie = draw(st.one_of(st.none(), st.none(), uint32))
            body += envelope(flags, frame, lie)
        body = body[: draw(st.sampled_from([len(body), len(body), len(body) // 2, 3]))]
        content_type = f"application/connect+{codec}"
    spoken = True
    if draw(st.integers(0, 9)) == 0:  # a content type of the other kind, or none of Connect's
        other = "application/connect+proto" if rpc.kind == "unary" else "application/proto"
        content_type, spoken = draw(st.sampled_from([other, "text/plain", ""])), False
    timeout = draw(st.sampled_from(["1000"] * 6 + ["0", "abc", "-1", "12345678901"]))
    return Call(rpc, content_type, body, timeout, spoken)


# -- checking answers ----------------------------------------------------------------
def check_error(error: object, status: int | None, said: str) -> None:
    """An error in Connect's shape, meant by the server (not ``unknown``, no ``internal``
    but the protocol's own), at Connect's status for its code (unary calls)."""
    assert isinstance(error, dict) and error.get("code") in CONNECT_STATUS, said
    message = error.get("message", "")
    assert isinstance(message, str), said
    assert error["code"] != "unknown", f"an exception the server did not mean: {said}"
    if error["code"] == "internal":
        assert message.startswith("protocol error"), said
    if status is not None:
        assert status == CONNECT_STATUS[error["code"]], said


def decode(rpc: Rpc, content_type: str, data: bytes) -> None:
    if content_type.endswith("proto"):
        rpc.output.from_binary(data)
    else:
        rpc.output.from_json(data)


def check_answer(call: Call, status: int, content_type: str, body: bytes) -> None:
    said = f"{call.rpc.path} {call.content_type!r} {call.body[:200]!r} -> {status} {body[:500]!r}"
    if status == 415:  # Connect's answer to a content type the route does not speak
        assert not call.spoken, said
        return
    if status != 200:  # a unary error, or one found before a stream began (its headers)
        assert content_type == "application/json", said
        check_error(json.loads(body), status, said)
        return
    assert call.spoken and content_type == call.content_type, said
    if call.rpc.kind == "unary":
        decode(call.rpc, content_type, body)
        return
    rest, ended = body, False
    while len(rest) >= 5:
        assert not ended, f"a message after the end of the stream: {said}"
        flags, length = rest[0], struct.unpack(">I", rest[1:5])[0]
        data, rest = rest[5 : 5 + length], rest[5 + length :]
        assert len(data) == length, said
        if flags & 2:
            ended = True
            end = json.loads(data)
            if "error" in end:
                check_error(end["error"], None, said)
        else:
            assert flags == 0, said
            decode(call.rpc, content_type, data)
    assert ended and not rest, f"the stream has no end message: {said}"


def send(client: httpx2.Client, call: Call) -> tuple[int, str, bytes]:
    headers = {"Connect-Timeout-Ms": call.timeout_ms}
    if call.content_type:
        headers["Content-Type"] = call.content_type
    with client.stream("POST", f"/{call.rpc.path}", content=call.body, headers=headers) as r:
        body = b""
        for chunk in r.iter_bytes():
            body += chunk
            assert len(body) <= READ_CAP, f"{call.rpc.path} answered more than {READ_CAP} bytes"
        return r.status_code, r.headers.get("content-type", ""), body


def test_fuzzed_envd_calls_get_connects_answers_in_bounded_memory(server: Server) -> None:
    created = httpx2.post(
        f"{server.url}/e2b/sandboxes",
        json={"templateID": "base", "timeout": 1800},
        headers={"X-API-Key": KEY_A},
        timeout=120,
    )
    assert created.status_code == 201, created.text
    sandbox = created.json()
    headers = {
        "E2b-Sandbox-Id": sandbox["sandboxID"],
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox["envdAccessToken"],
        "Connect-Protocol-Version": "1",
    }
    client = httpx2.Client(base_url=f"{server.url}/e2b/sandbox", headers=headers, timeout=60)
    alive = Call(MESSAGES["Stat"][0], "application/json", b'{"path": "/"}', "5000", True)
    assert send(client, alive)[0] == 200
    before = rss(server)

    @settings(
        max_examples=int(os.environ.get("KS_FUZZ_ENVD_EXAMPLES", "300")),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(call=calls())
    def fuzz(call: Call) -> None:
        check_answer(call, *send(client, call))

    fuzz()

    # bodies past the server's request cap: real bytes, and envelopes that only claim them
    big = b'{"path": "' + b"a" * MAX_REQUEST_BYTES + b'"}'
    stat, start = MESSAGES["Stat"][0], MESSAGES["Start"][0]
    claims = [2**32 - 1, MAX_REQUEST_BYTES + 1]
    for call in [
        Call(stat, "application/json", big, "5000", True),
        Call(start, "application/connect+json", envelope(0, big), "5000", True),
        *(
            Call(start, "application/connect+proto", envelope(0, b"\n", n), "5000", True)
            for n in claims
        ),
    ] * 3:
        status, content_type, body = send(client, call)
        check_answer(call, status, content_type, body)
        assert b'"code": "resource_exhausted"' in body, body[:300]

    assert send(client, alive)[0] == 200  # still serving
    grown = rss(server) - before
    assert grown < RSS_GROWTH_CAP, f"the server's memory grew {grown >> 20} MiB"
    client.close()
