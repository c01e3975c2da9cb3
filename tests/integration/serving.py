"""A real ``kernel-sandbox serve`` process for the server tests, and ms-enclave's client.

The server runs as a subprocess on a free port with two keys; everything it creates
carries ``kernel-sandbox.server=<name>``, and the fixture removes whatever is left.
ms-enclave lives in a test-only virtualenv (never a dependency of the package), made
once by :func:`enclave_python`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from tests.waiting import wait_for

ROOT = Path(__file__).parents[2]
KEY_A, KEY_B = "test-key-a", "test-key-b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """One server process; ``start`` again after ``kill`` to restart it."""

    name: str
    record_dir: Path
    extra: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    #: Where the server's log goes (a file the test can measure); None: a pipe.
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        args = [
            sys.executable, "-m", "kernel_sandbox.cli.main", "serve",
            "--port", str(self.port), "--api-key", KEY_A, "--api-key", KEY_B,
            "--name", self.name, "--image", "kernel-sandbox:python",
            "--record-dir", str(self.record_dir), *self.extra,
        ]  # fmt: skip
        if "--snapshot-dir" not in self.extra:  # beside the notebooks, not in the checkout
            args += [
                "--snapshot-dir",
                str(self.record_dir.with_name(f"{self.record_dir.name}-snapshots")),
            ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if self.log is not None:
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stderr=log)
        else:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE)
        wait_for(self._healthy, 120, 0.2, "the server to answer")  # a loaded machine is slow
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            said = self.log.read_bytes() if self.log else self.proc.stderr.read()  # type: ignore[union-attr]
            raise RuntimeError(f"server exited: {said.decode()[-2000:]}")
        with contextlib.suppress(httpx2.HTTPError):
            r = httpx2.get(f"{self.url}/health", headers={"X-API-Key": KEY_A}, timeout=2)
            return r.status_code == 200
        return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        from kernel_sandbox.server.restart import remove_leftovers

        # in a thread of its own: async tests call this from inside their event loop
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, remove_leftovers(self.name)).result()


def client(server: Server, key: str | None = KEY_A) -> httpx2.AsyncClient:
    headers = {"X-API-Key": key} if key else {}
    return httpx2.AsyncClient(base_url=server.url, headers=headers, timeout=120)


def text(response: httpx2.Response) -> str:
    """What the call printed and returned, as text."""
    assert response.status_code == 200, response.text
    parts = []
    for out in response.json()["outputs"]:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts).strip()


def code_cells(nb: dict[str, object]) -> list[str]:
    cells = nb["cells"]
    assert isinstance(cells, list)
    return [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in cells
        if c["cell_type"] == "code"
    ]


def appended(nb: dict[str, object]) -> list[int]:
    """The numbers of the notebook's ``ran.append(N)...`` cells, in the notebook's order
    (the soaks' check that every call's cell is there once, in the kernel's order)."""
    return [
        int(code.removeprefix("ran.append(").split(")")[0])
        for code in code_cells(nb)
        if code.startswith("ran.append(")
    ]
