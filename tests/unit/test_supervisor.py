"""The supervisor script, run with the host's POSIX sh and a stand-in kernel (no daemon)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox.errors import KernelError
from kernel_sandbox.kernel import supervisor as protocol
from kernel_sandbox.kernel.supervisor import (
    GO_PREFIX,
    STATUS_FILE,
    SUPERVISOR,
    KernelEnd,
    parse_status,
    wait_for_kernel_end,
)
from tests.waiting import wait_for

# A stand-in kernel that starts a grandchild, so killing only the kernel would leave one.
KERNEL = 'sleep 1000 & echo "$$ $!" > "$1/pids.new"; mv "$1/pids.new" "$1/pids"; wait'


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def sleep_log(tmp_path: Path) -> Path:
    """Where the supervisor's ``sleep`` calls are logged (a ``sleep`` first on its PATH)."""
    return tmp_path / "sleeps"


@pytest.fixture
def supervisor(tmp_path: Path, sleep_log: Path) -> Iterator[subprocess.Popen[bytes]]:
    shim = tmp_path / "bin"
    shim.mkdir()
    # each call is logged with whether the kernel's end was reported yet
    status = tmp_path / STATUS_FILE
    (shim / "sleep").write_text(
        f"#!/bin/sh\n[ -e {status} ] && when=reported || when=unreported\n"
        f'echo "$* $when" >> {sleep_log}\nexec {shutil.which("sleep")} "$@"\n'
    )
    (shim / "sleep").chmod(0o755)
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
        ],
        env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"},
    )
    yield proc
    proc.kill()
    proc.wait()
    pids = tmp_path / "pids"
    if pids.exists():  # leave no stand-in kernel behind: its group is named by its pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pids.read_text().split()[0]), signal.SIGKILL)


def kernel_pids(tmp_path: Path) -> list[int]:
    wait_for(lambda: (tmp_path / "pids").exists(), 30, 0.02, "the kernel to start")
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def test_kill_signal_ends_the_process_group_and_reports_it(
    supervisor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    kernel, child = kernel_pids(tmp_path)
    supervisor.send_signal(signal.SIGUSR1)
    end = wait_for_end(tmp_path, 1)
    assert end == KernelEnd(128 + signal.SIGKILL, False)  # not 138: the trap's own wait
    # SIGKILL was sent to the whole group before the report; its delivery takes a moment
    wait_for(lambda: not alive(kernel) and not alive(child), 30, 0.02, "the kernel's group to die")


def test_nothing_forks_between_the_kernels_end_and_its_report(
    supervisor: subprocess.Popen[bytes], tmp_path: Path, sleep_log: Path
) -> None:
    # A fork the process limit refuses ends a POSIX sh, and a killed fork bomb's group
    # holds the limit until it is reaped: the supervisor waits for it on builtins only.
    kernel_pids(tmp_path)
    supervisor.send_signal(signal.SIGUSR1)
    wait_for_end(tmp_path, 1)
    # (the stand-in kernel's own `sleep 1000` may or may not have been logged)
    calls = sleep_log.read_text().splitlines() if sleep_log.exists() else []
    assert [c for c in calls if c.endswith(" unreported") and not c.startswith("1000 ")] == []


def wait_for_end(tmp_path: Path, kernel: int) -> KernelEnd:
    status = tmp_path / STATUS_FILE
    wait_for(
        lambda: status.exists() and parse_status(status.read_text(), kernel), 30, 0.02, "the report"
    )
    end = parse_status(status.read_text(), kernel)
    assert end is not None
    return end


def polls(sleep_log: Path) -> int:
    """How often the supervisor has looked for its go-ahead (one short sleep each)."""
    return sleep_log.read_text().split().count("0.05") if sleep_log.exists() else 0


def test_a_new_kernel_starts_only_after_the_go_file_of_the_last(
    supervisor: subprocess.Popen[bytes], tmp_path: Path, sleep_log: Path
) -> None:
    first = kernel_pids(tmp_path)
    os.kill(first[0], signal.SIGSEGV)  # a crash: the rest of its group goes too
    assert wait_for_end(tmp_path, 1) == KernelEnd(128 + signal.SIGSEGV, False)
    wait_for(lambda: not alive(first[1]), 30, 0.02, "the crashed kernel's child to be killed")
    (tmp_path / "pids").unlink()
    (tmp_path / f"{GO_PREFIX}2").touch()  # not the go-ahead for kernel 1
    seen = polls(sleep_log)
    # the supervisor looked again (twice, so at least once after go-2 existed) and waits
    wait_for(lambda: polls(sleep_log) >= seen + 2, 30, 0.02, "the supervisor to look for go-1")
    assert not (tmp_path / "pids").exists()
    (tmp_path / f"{GO_PREFIX}1").touch()
    second = kernel_pids(tmp_path)
    assert second != first
    os.kill(second[0], signal.SIGKILL)
    assert wait_for_end(tmp_path, 2) == KernelEnd(128 + signal.SIGKILL, False)


def test_reports_go_into_a_fifo_without_blocking_a_reader(tmp_path: Path) -> None:
    """With ipc the status is the host's FIFO: the supervisor writes, the host reads."""
    fifo = tmp_path / STATUS_FILE
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    proc = subprocess.Popen(
        ["sh", "-c", SUPERVISOR, "supervisor", str(tmp_path), "sh", "-c", "exit 7"]
    )
    try:
        read = bytearray()

        def reported() -> KernelEnd | None:
            with contextlib.suppress(BlockingIOError):
                read.extend(os.read(reader, 4096))
            return parse_status(read.decode(), 1)

        assert wait_for(reported, 30, 0.02, "a report in the FIFO") == KernelEnd(7, False)
        assert fifo.exists() and proc.poll() is None  # the FIFO is kept; it waits for go-1
    finally:
        proc.kill()
        proc.wait()
        os.close(reader)


def test_termination_signals_never_end_the_supervisor(
    supervisor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    kernel, _ = kernel_pids(tmp_path)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        supervisor.send_signal(sig)
    supervisor.send_signal(signal.SIGUSR1)  # handled after the three above
    assert wait_for_end(tmp_path, 1) == KernelEnd(128 + signal.SIGKILL, False)
    assert supervisor.poll() is None and not alive(kernel)


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("\n2 3 0 0\n", KernelEnd(3, False)),
        ("\n2 137 1 2\n", KernelEnd(137, True)),
        ("junk\n2 137 2 2\n1 0 0 0\nmore junk", KernelEnd(137, False)),
        ("\n2 1 0 0\n\n2 9 0 0\n", KernelEnd(9, False)),
    ],
)
def test_the_last_report_of_the_kernel_is_parsed(text: str, end: KernelEnd) -> None:
    assert parse_status(text, 2) == end


@pytest.mark.parametrize(
    "text", ["", "2 3 0 0", "\n2 3 0\n", "\n2 3 0 x\n", "\n2 -1 0 0\n", "\n1 3 0 0\n"]
)
def test_no_complete_report_of_the_kernel_is_not_an_end(text: str) -> None:
    assert parse_status(text, 2) is None


async def test_hosts_wait_for_the_report_of_the_killed_kernel() -> None:
    reports = iter([None, None, KernelEnd(137, False)])

    async def kernel_end() -> KernelEnd | None:
        return next(reports)

    assert await wait_for_kernel_end(kernel_end, poll=0.001) == KernelEnd(137, False)


async def test_a_kernel_end_never_reported_is_a_kernel_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(protocol, "KILL_LIMIT", 0.05)
    asked = 0

    async def kernel_end() -> KernelEnd | None:
        nonlocal asked
        asked += 1
        return None

    with pytest.raises(KernelError, match=r"did not report the kernel's end within 0\.05s"):
        await wait_for_kernel_end(kernel_end, poll=0.01)
    assert asked > 1
