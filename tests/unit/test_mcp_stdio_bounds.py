"""``kernel-sandbox mcp`` (stdio) reads bounded lines: a huge or costly message is
refused with a JSON-RPC error for its id, without the process holding it.

The real CLI as a subprocess; no tool is called, so no sandbox (nor engine) is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from kernel_sandbox.limits import MAX_MCP_LINE_BYTES

ROOT = Path(__file__).parents[2]
#: What one refused message may add to the process's peak memory.
MAX_GROWTH_MB = 64


def _status(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


def _send(pipe: IO[bytes], message: dict[str, Any]) -> None:
    pipe.write(json.dumps(message).encode() + b"\n")
    pipe.flush()


def _answer(pipe: IO[bytes]) -> dict[str, Any]:
    while True:  # notifications may come first
        message: dict[str, Any] = json.loads(pipe.readline())
        if "id" in message:
            return message


def test_a_64_mib_line_and_a_costly_one_are_refused_with_an_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_DATA_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_sandbox.cli.main", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        _send(proc.stdin, init)
        assert "result" in _answer(proc.stdout)
        _send(proc.stdin, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        before = _status(proc.pid, "VmRSS")
        huge = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"x": "'
        proc.stdin.write(huge)
        chunk = b"a" * (1024 * 1024)
        for _ in range(64):
            proc.stdin.write(chunk)
        proc.stdin.write(b'"}}\n')
        proc.stdin.flush()
        refused = _answer(proc.stdout)
        assert refused["id"] == 7 and "longer than" in refused["error"]["message"]
        assert f"{MAX_MCP_LINE_BYTES:,}" in refused["error"]["message"]
        costly = b'{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"x": ['
        proc.stdin.write(costly + b"{}," * 1_000_000 + b"{}]}}\n")
        proc.stdin.flush()
        refused = _answer(proc.stdout)
        assert refused["id"] == 8 and "values" in refused["error"]["message"]
        _send(proc.stdin, {"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert _answer(proc.stdout) == {"jsonrpc": "2.0", "id": 9, "result": {}}
        growth = _status(proc.pid, "VmHWM") - before
        assert growth <= MAX_GROWTH_MB, f"the process peaked {growth:.0f} MB above its start"
    finally:
        proc.stdin.close()
        proc.wait(60)
    assert b"refused a message" in proc.stderr.read()
