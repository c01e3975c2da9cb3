"""The host's run directory for ipc sandboxes, without a daemon: sealing and the status FIFO."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox import rundirs
from kernel_sandbox.backends.docker.statedir import ContainerStateDir, HostRunDir
from kernel_sandbox.errors import KernelError
from kernel_sandbox.kernel.supervisor import KernelEnd
from kernel_sandbox.limits import STATUS_LINE_BYTES
from kernel_sandbox.rundirs import OWNER_FILE

SOCKETS = {"k-1", "k-2"}


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[HostRunDir]:
    state = HostRunDir(tmp_path / "run", SOCKETS)
    yield state
    state.close()


def bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def write_status(state: HostRunDir, data: bytes) -> None:
    fd = os.open(state.path / "status", os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_seal_keeps_only_the_kernel_sockets_and_the_host_files(run_dir: HostRunDir) -> None:
    path = run_dir.path
    assert stat.S_IMODE(path.stat().st_mode) == 0o1777  # open for the first kernel
    sockets = [bind(path / name) for name in SOCKETS]
    (path / "junk").write_bytes(b"x" * 1000)
    (path / "k-3").write_text("not a socket of this kernel")
    (path / "k-1.bak").symlink_to("/etc/passwd")
    (path / "deep" / "er").mkdir(parents=True)
    (path / "deep" / "er" / "file").write_text("x")
    (path / "go-1").touch()
    run_dir.seal()
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert sorted(os.listdir(path)) == sorted([*SOCKETS, OWNER_FILE, "status"])
    assert stat.S_ISFIFO((path / "status").stat().st_mode)
    for s in sockets:
        s.close()


def test_open_for_kernel_removes_the_dead_kernel_sockets(run_dir: HostRunDir) -> None:
    sockets = [bind(run_dir.path / name) for name in SOCKETS]
    run_dir.seal()
    run_dir.open_for_kernel()
    assert stat.S_IMODE(run_dir.path.stat().st_mode) == 0o1777
    assert sorted(os.listdir(run_dir.path)) == sorted([OWNER_FILE, "status"])
    for s in sockets:
        s.close()


async def test_the_fifo_report_is_found_among_junk_and_remembered(run_dir: HostRunDir) -> None:
    assert await run_dir.kernel_end() is None  # nobody wrote: no block, no end
    write_status(run_dir, b"junk without newline")
    assert await run_dir.kernel_end() is None
    write_status(run_dir, b"\n1 137 0 1\n")
    assert await run_dir.kernel_end() == KernelEnd(137, True)
    assert await run_dir.kernel_end() == KernelEnd(137, True)  # read once, kept
    await run_dir.start_next()
    assert (run_dir.path / "go-1").exists()
    assert await run_dir.kernel_end() is None  # kernel 2 runs
    write_status(run_dir, b"\n1 0 0 0\n")  # a late or forged report of kernel 1
    assert await run_dir.kernel_end() is None
    write_status(run_dir, b"\n2 3 0 0\n")
    assert await run_dir.kernel_end() == KernelEnd(3, False)


async def test_an_endless_unfinished_line_is_dropped_not_kept(run_dir: HostRunDir) -> None:
    write_status(run_dir, b"y" * (32 * STATUS_LINE_BYTES))  # no newline: never a report
    assert await run_dir.kernel_end() is None
    write_status(run_dir, b"1 9 0 0\n")  # the junk before it was dropped, not prepended
    assert await run_dir.kernel_end() == KernelEnd(9, False)


async def test_a_full_fifo_is_drained_and_holds_at_most_a_pipe(run_dir: HostRunDir) -> None:
    fd = os.open(run_dir.path / "status", os.O_WRONLY | os.O_NONBLOCK)
    written = 0
    try:
        while True:
            written += os.write(fd, b"y" * 4096)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    assert written <= 1 << 20  # the kernel's pipe buffer, not the disk, holds it
    assert await run_dir.kernel_end() is None
    write_status(run_dir, b"\n1 9 0 0\n")  # there is room again
    assert await run_dir.kernel_end() == KernelEnd(9, False)


def test_close_removes_the_directory(tmp_path: Path) -> None:
    state = HostRunDir(tmp_path / "run", SOCKETS)
    state.seal()
    state.close()
    assert not (tmp_path / "run").exists()


def test_a_folder_planted_in_a_sockets_place(tmp_path: Path) -> None:
    state = HostRunDir(tmp_path / "run", {"k-1", "k-2", "k-3"})
    try:
        state.seal()
        os.chmod(state.path, 0o1777)  # as a container restart opened it
        (state.path / "k-1").mkdir()
        (state.path / "k-1" / "junk").write_bytes(b"x" * 1000)
        (state.path / "k-2").symlink_to("/etc")
        state.open_for_kernel()  # no IsADirectoryError, nothing followed
        assert sorted(os.listdir(state.path)) == [".owner", "status"]
        assert stat.S_IMODE(state.path.stat().st_mode) == 0o1777
        (state.path / "k-3").mkdir()  # the kernel never came: sealed anyway
        state.seal()
        assert stat.S_IMODE(state.path.stat().st_mode) == 0o755
        assert sorted(os.listdir(state.path)) == [".owner", "status"]
    finally:
        state.close()
    assert not (tmp_path / "run").exists()


def test_a_tcp_adopters_claim_is_held_refused_twice_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNEL_SANDBOX_RUNTIME_DIR", str(tmp_path))
    marker = rundirs.adoption_dir("0123456789ab")
    assert marker is not None and not rundirs.is_claimed(marker)
    first = ContainerStateDir.adopt(None, "container", "sandbox", "0123456789ab")  # type: ignore[arg-type]
    assert rundirs.is_claimed(marker)  # what gc reads
    with pytest.raises(KernelError, match="held by a live process"):
        ContainerStateDir.adopt(None, "container", "sandbox", "0123456789ab")  # type: ignore[arg-type]
    first.release()  # detach (and close) give it up
    assert not rundirs.is_claimed(marker) and not marker.exists()
    with pytest.raises(KernelError, match="not a sandbox id"):
        ContainerStateDir.adopt(None, "container", "sandbox", "../up")  # type: ignore[arg-type]
