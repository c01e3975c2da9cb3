"""Streamed file transfer through the server: a file larger than it should hold.

    python bench/transfer.py                 # 200 MB up and down through /v1
    python bench/transfer.py --mb 500

Starts ``kernel-sandbox serve``, uploads a host file into a sandbox with
``RemoteFiles.upload`` and downloads it back with ``RemoteFiles.download``, while a
thread samples the server process's resident memory (``VmRSS``) every 20 ms.  Prints
the server's RSS before, its peak during each transfer, and the rates; the bytes are
compared at the end.  ``--server-root`` runs the server from another checkout (to
compare with an older version).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from kernel_sandbox.client.remote import RemoteSandbox  # noqa: E402
from kernel_sandbox.server.restart import remove_leftovers  # noqa: E402

KEY = "bench-key"
MB = 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """The peak RSS of a process while a ``with`` block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()

    def __enter__(self) -> Sampler:
        self.peak = rss_mb(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MB):
            h.update(chunk)
    return h.hexdigest()


async def main(args: argparse.Namespace) -> dict[str, object]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    name = f"bench-transfer-{os.getpid()}"
    size = args.mb * MB
    cmd = [sys.executable, "-m", "kernel_sandbox.cli.main", "serve", "--port", str(port),
           "--api-key", KEY, "--name", name, "--image", "kernel-sandbox:python",
           "--max-upload-bytes", str(size + MB),
           "--record-dir", "/tmp/ks-bench-notebooks"]  # fmt: skip
    root = Path(args.server_root).resolve()
    proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    url = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="ks-transfer-"))
    source, back = work / "up.bin", work / "down.bin"
    with source.open("wb") as f:  # incompressible, written a MiB at a time
        for _ in range(args.mb):
            f.write(os.urandom(MB))
    try:
        for _ in range(300):
            try:
                if httpx2.get(f"{url}/health", headers={"X-API-Key": KEY}).is_success:
                    break
            except httpx2.HTTPError:
                time.sleep(0.1)
        async with await RemoteSandbox.create(url, api_key=KEY, disk_limit="1g") as sb:
            await sb.files.write("warm.txt", "x")  # the first call's imports out of the way
            await sb.files.read("warm.txt")
            before = rss_mb(proc.pid)
            with Sampler(proc.pid) as up:
                t = time.perf_counter()
                await sb.files.upload(source, "big.bin")
                up_s = time.perf_counter() - t
            with Sampler(proc.pid) as down:
                t = time.perf_counter()
                await sb.files.download("big.bin", back)
                down_s = time.perf_counter() - t
            after = rss_mb(proc.pid)
        same = digest(source) == digest(back)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        await remove_leftovers(name)
        for p in (source, back):
            p.unlink(missing_ok=True)
        work.rmdir()
    return {
        "file_mb": args.mb,
        "server_rss_before_mb": round(before, 1),
        "server_rss_peak_upload_mb": round(up.peak, 1),
        "server_rss_peak_download_mb": round(down.peak, 1),
        "server_rss_after_mb": round(after, 1),
        "upload_mb_per_s": round(args.mb / up_s, 1),
        "download_mb_per_s": round(args.mb / down_s, 1),
        "bytes_equal": same,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--server-root", default=str(ROOT), help="checkout the server runs from")
    figures = asyncio.run(main(parser.parse_args()))
    print(json.dumps(figures, indent=2))
