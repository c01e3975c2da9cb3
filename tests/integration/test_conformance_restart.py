"""The first cell after a restart through jupyter_server: its reply always comes, its output
comes back on the websocket that stayed open.

What JupyterLab's "restart and run all" does: ``POST /api/kernels/ID/restart``, then at
once an ``execute_request`` on the kernel's websocket that stayed open.  The server's
ZMQ sockets behind that websocket reconnect to the restarted kernel by themselves; a
kernel that publishes before its iopub subscription is back loses the output (the reply
still comes).  A real ``jupyter server`` runs our kernelspec (standing in for
``python3``) and the stock one at the same time; each is restarted many times and every
first output after a restart is counted and printed.

Ours loses none (issue 30): the manager's links to the sandbox's ipc sockets are back
as soon as the restart's cleanup returns, and the listening sockets outlive the kernel,
so the open channels are connected again before the next kernel publishes anything.
The stock kernel binds its sockets anew at every start and its iopub can reconnect too
late: its losses are printed beside ours, not asserted (the race is jupyter_server's).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from tests.integration.suites import ROOT, containers_left, install_ours
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

#: Restarts per kernel: stock lost 0-7 of 25 first outputs in earlier measures.
RESTARTS = 25
#: Seconds an output may take to follow the reply before it counts as lost.
OUTPUT_GRACE = 3.0


@dataclass
class Server:
    """A running ``jupyter server``: where it listens and its token."""

    url: str
    token: str
    proc: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def jupyter_server(where: Path, extra_env: dict[str, str]) -> Iterator[Server]:
    """A ``jupyter server`` subprocess with ``extra_env`` (JUPYTER_PATH), ready."""
    where.mkdir(parents=True, exist_ok=True)
    port, token = _free_port(), uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    env["JUPYTER_RUNTIME_DIR"] = str(where / "runtime")
    env["JUPYTER_DATA_DIR"] = str(where / "data")
    argv = [sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
            "--ServerApp.ip=127.0.0.1", "--allow-root", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={where}"]  # fmt: skip
    with open(where / "server.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", token, proc)
    try:

        def listening() -> bool:
            assert proc.poll() is None, (where / "server.log").read_text()[-2000:]
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                return True
            return False

        wait_for(listening, 60, 0.2, "jupyter server to listen")
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _execute(code: str, session: str) -> dict[str, object]:
    return {
        "header": {
            "msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "session": session,
            "username": "test", "version": "5.3",
            "date": datetime.datetime.now(datetime.UTC).isoformat(),
        },
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }  # fmt: skip


async def count_lost(server: Server, kernel_name: str, restarts: int) -> tuple[int, int]:
    """Restart a kernel ``restarts`` times over REST; first outputs lost, and replies."""
    http = AsyncHTTPClient()
    auth = {"Authorization": f"token {server.token}"}

    async def rest(method: str, path: str, body: object = None) -> dict[str, object]:
        request = HTTPRequest(
            server.url + path, method=method, headers=auth, request_timeout=120,
            body=json.dumps(body) if body is not None else (None if method != "POST" else ""),
        )  # fmt: skip
        response = await http.fetch(request)
        return json.loads(response.body) if response.body else {}

    kernel = await rest("POST", "/api/kernels", {"name": kernel_name})
    kid = kernel["id"]
    session = uuid.uuid4().hex
    ws_url = server.url.replace("http", "ws") + f"/api/kernels/{kid}/channels?session_id={session}"
    ws = await websocket_connect(HTTPRequest(ws_url, headers=auth))
    lost = replies = 0
    try:
        for i in range(restarts + 1):
            if i:  # the first round only proves the kernel and the websocket work
                await rest("POST", f"/api/kernels/{kid}/restart")
            request = _execute(f"print('out-{i}')", session)
            msg_id = request["header"]["msg_id"]  # type: ignore[index]
            await ws.write_message(json.dumps(request))
            got_output = got_reply = False
            deadline = None
            while not got_output:
                left = 60.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    raw = await asyncio.wait_for(ws.read_message(), left)
                except TimeoutError:
                    break
                assert raw is not None, "the websocket closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream" and f"out-{i}" in msg["content"]["text"]:
                    got_output = True
                elif msg["msg_type"] == "execute_reply":
                    got_reply = True
                    deadline = time.monotonic() + OUTPUT_GRACE
            assert got_reply or got_output, f"round {i}: no reply in 60 s"
            if i == 0:
                assert got_output, "no output before any restart"
            else:
                replies += 1
                lost += not got_output
    finally:
        ws.close()
        await rest("DELETE", f"/api/kernels/{kid}")  # fails the test if it fails
    return lost, replies


async def _both(servers: dict[str, Server], restarts: int) -> dict[str, tuple[int, int]]:
    names = list(servers)
    counts = await asyncio.gather(*(count_lost(servers[n], "python3", restarts) for n in names))
    return dict(zip(names, counts, strict=True))


@pytest.mark.timeout(600)
def test_outputs_come_back_after_restarts_through_jupyter_server(  # type: ignore[no-untyped-def]
    docker_engine, tmp_path: Path
) -> None:
    label = f"{os.getpid()}-{time.monotonic_ns()}"
    ours_env = install_ours(tmp_path / "ours", "kernel-sandbox:python", label)
    stock_env = {"JUPYTER_PATH": str(tmp_path / "empty")}
    with (
        jupyter_server(tmp_path / "stock-root", stock_env) as stock,
        jupyter_server(tmp_path / "ours-root", ours_env) as ours,
    ):
        counts = asyncio.run(_both({"stock": stock, "ours": ours}, RESTARTS))
    report = ", ".join(f"{k}: lost {lost}/{n}" for k, (lost, n) in counts.items())
    assert counts["stock"][1] == counts["ours"][1] == RESTARTS, report
    print(f"\n[restarts through jupyter_server] first outputs {report}")
    assert counts["ours"][0] == 0, report
    assert containers_left(label) == []
