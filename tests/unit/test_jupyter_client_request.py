"""What a Jupyter client asks of a sandboxed kernel, filtered; the notebook folder's copy."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from kernel_sandbox.jupyter.client_request import kernel_arguments, kernel_env
from kernel_sandbox.jupyter.notebook_dir import FolderTooLarge, folder_archive, mount_volume
from kernel_sandbox.limits import KERNEL_ARGS_MAX, KERNEL_ENV_MAX_BYTES


def test_client_arguments_pass_except_the_connection_ones() -> None:
    kept, dropped = kernel_arguments(
        [
            "--HistoryManager.hist_file=:memory:",
            "--InlineBackend.figure_format", "svg",  # option and value as two arguments
            "--debug",
            "-f", "/host/kernel.json",
            "--ip=0.0.0.0",
            "--IPKernelApp.shell_port=5555",
            "--Session.key=abc",
            "--IPKernelApp.kernel_class=evil.Kernel",
            "positional",
        ]
    )  # fmt: skip
    assert kept == [
        "--HistoryManager.hist_file=:memory:", "--InlineBackend.figure_format", "svg", "--debug"
    ]  # fmt: skip
    assert dropped == [
        "-f", "/host/kernel.json", "--ip=0.0.0.0", "--IPKernelApp.shell_port=5555",
        "--Session.key=abc", "--IPKernelApp.kernel_class=evil.Kernel", "positional",
    ]  # fmt: skip


def test_a_flood_of_arguments_is_cut_at_the_bound() -> None:
    kept, dropped = kernel_arguments([f"--A.b{i}=1" for i in range(KERNEL_ARGS_MAX * 3)])
    assert len(kept) == KERNEL_ARGS_MAX and len(dropped) == KERNEL_ARGS_MAX * 2
    kept, dropped = kernel_arguments(["--A.b=" + "x" * 100_000])
    assert kept == [] and len(dropped) == 1


def test_only_what_the_client_set_reaches_the_kernel() -> None:
    host = {"HOME": "/root", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "PATH": "/usr/bin"}
    env = {
        **host,  # jupyter_client starts from a copy of the host's environment
        "JPY_SESSION_NAME": "nb.ipynb",
        "IPYKERNEL_CELL_NAME": "<cell>",
        "LD_PRELOAD": "/host/lib.so",
        "PYTHONPATH": "/host/src",
        "PATH": "/host/bin:/usr/bin",  # the client's own value, still refused
        "KERNEL_SANDBOX_CONNECTION": "{}",
        "JPY_PARENT_PID": "123",
        "HTTPS_PROXY": "http://elsewhere:3128",
        "bad name": "x",
    }
    kept, dropped = kernel_env(env, host)
    assert kept == {"IPYKERNEL_CELL_NAME": "<cell>", "JPY_SESSION_NAME": "nb.ipynb"}
    assert "AWS_SECRET_ACCESS_KEY" not in dropped  # the host's: never reported, never passed
    assert set(dropped) == {
        "LD_PRELOAD", "PYTHONPATH", "PATH", "KERNEL_SANDBOX_CONNECTION", "JPY_PARENT_PID",
        "HTTPS_PROXY", "bad name",
    }  # fmt: skip
    assert kernel_env(dict(os.environ))[0] == {}  # the default host is os.environ


def test_a_flood_of_variables_is_cut_at_the_bound() -> None:
    env = {f"V{i:05d}": "x" * 1000 for i in range(200)}
    kept, dropped = kernel_env(env, {})
    assert sum(len(k) + len(v) + 2 for k, v in kept.items()) <= KERNEL_ENV_MAX_BYTES
    assert len(kept) == KERNEL_ENV_MAX_BYTES // 1008 and len(dropped) == 200 - len(kept)


def _members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_folder_copy_keeps_links_as_links_and_skips_other_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    folder = tmp_path / "nb"
    (folder / "sub").mkdir(parents=True)
    (folder / "data.csv").write_text("a,b\n1,2\n")
    (folder / "sub" / "deep.txt").write_text("deep")
    (folder / "out").symlink_to(secret)
    (folder / "outdir").symlink_to(tmp_path)
    os.mkfifo(folder / "pipe")
    members = _members(folder_archive(folder))
    assert set(members) == {"data.csv", "sub", "sub/deep.txt", "out", "outdir"}
    assert members["out"].issym() and members["out"].linkname == str(secret)
    assert members["outdir"].issym()
    assert members["data.csv"].size == 8
    assert all(m.size == 0 for m in members.values() if not m.isfile())  # nothing followed


def test_folder_copy_refuses_a_folder_over_its_bounds(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i}").write_bytes(b"x" * 100)
    with pytest.raises(FolderTooLarge, match="more than 10 files"):
        folder_archive(tmp_path, max_files=10)
    with pytest.raises(FolderTooLarge, match="more than 1,000 bytes"):
        folder_archive(tmp_path, max_bytes=1000)
    assert len(_members(folder_archive(tmp_path, max_files=30, max_bytes=3000))) == 30


def test_mount_is_read_only_and_never_the_root(tmp_path: Path) -> None:
    assert mount_volume(tmp_path, "/sandbox") == {
        str(tmp_path.resolve()): {"bind": "/sandbox", "mode": "ro"}
    }
    with pytest.raises(ValueError, match="root never is"):
        mount_volume("/", "/sandbox")
