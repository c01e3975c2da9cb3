"""The supervisor script, run with the host's POSIX sh and a stand-in kernel (no daemon)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox.kernel.supervisor import STATUS_FILE, SUPERVISOR, KernelEnd, parse_status

# A stand-in kernel that starts a grandchild, so killing only the kernel would leave one.
KERNEL = 'sleep 1000 & echo "$$ $!" > "$1/pids.new"; mv "$1/pids.new" "$1/pids"; wait'


def wait_for(condition, what: str, limit: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            SUPERVISOR,
            "supervisor",
            str(tmp_path),
            "sh",
            "-c",
            KERNEL,
            "k",
            str(tmp_path),
        ]
    )
    yield proc
    proc.kill()
    proc.wait()
    pids = tmp_path / "pids"
    if pids.exists():  # leave no stand-in kernel behind: its group is named by its pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pids.read_text().split()[0]), signal.SIGKILL)


def kernel_pids(tmp_path: Path) -> list[int]:
    wait_for(lambda: (tmp_path / "pids").exists(), "the kernel to start")
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def test_kill_signal_ends_the_process_group_and_reports_it(
    supervisor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    kernel, child = kernel_pids(tmp_path)
    supervisor.send_signal(signal.SIGUSR1)
    status = tmp_path / STATUS_FILE
    wait_for(status.exists, "the status file")
    assert parse_status(status.read_text()) == KernelEnd(128 + signal.SIGKILL, False)
    assert not alive(kernel) and not alive(child)


def test_a_new_kernel_starts_only_when_the_status_is_removed(
    supervisor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    first = kernel_pids(tmp_path)
    os.kill(first[0], signal.SIGSEGV)  # a crash: the rest of its group goes too
    status = tmp_path / STATUS_FILE
    wait_for(status.exists, "the status file")
    assert parse_status(status.read_text()) == KernelEnd(128 + signal.SIGSEGV, False)
    wait_for(lambda: not alive(first[1]), "the crashed kernel's child to be killed")
    (tmp_path / "pids").unlink()
    time.sleep(0.3)  # a blind respawn would have started a kernel by now
    assert not (tmp_path / "pids").exists()
    status.unlink()
    assert kernel_pids(tmp_path) != first


def test_termination_signals_are_ignored(
    supervisor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    kernel, _ = kernel_pids(tmp_path)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        supervisor.send_signal(sig)
    supervisor.send_signal(signal.SIGUSR1)  # handled after the three above
    wait_for((tmp_path / STATUS_FILE).exists, "the status file")
    assert supervisor.poll() is None and not alive(kernel)


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("3 0 0\n", KernelEnd(3, False)),
        ("137 1 2\n", KernelEnd(137, True)),
        ("137 2 2", KernelEnd(137, False)),
    ],
)
def test_status_is_parsed(text: str, end: KernelEnd) -> None:
    assert parse_status(text) == end


@pytest.mark.parametrize("text", ["", "3 0", "3 0 x", "-1 0 0"])
def test_incomplete_status_is_not_an_end(text: str) -> None:
    assert parse_status(text) is None
