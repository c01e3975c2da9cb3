"""sandbox.files: binary-safe, relative to the working dir, with the sandbox user's rights."""

from __future__ import annotations

import os

import pytest

from kernel_sandbox.errors import FileOperationError, SandboxFileNotFoundError
from kernel_sandbox.sandbox import AsyncSandbox

pytestmark = pytest.mark.integration


async def test_binary_round_trip_of_50_mb(py_sandbox: AsyncSandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    payload = os.urandom(50 * 1024 * 1024)
    local = tmp_path / "big.bin"
    local.write_bytes(payload)
    await py_sandbox.files.upload(local, "data/big.bin")
    size = await py_sandbox.run_python("import os; os.path.getsize('data/big.bin')")
    assert size.text == str(len(payload))
    await py_sandbox.files.download("/sandbox/data/big.bin", tmp_path / "back" / "big.bin")
    assert (tmp_path / "back" / "big.bin").read_bytes() == payload


async def test_write_read_list_exists_remove(py_sandbox: AsyncSandbox) -> None:
    files = py_sandbox.files
    await files.write("notes/a.txt", "héllo\n")
    await files.write("notes/b.bin", b"\x00\xff")
    await files.append("notes/a.txt", "more\n")
    await files.mkdir("notes/sub")
    assert await files.read_text("notes/a.txt") == "héllo\nmore\n"
    assert await files.read("/sandbox/notes/b.bin") == b"\x00\xff"
    listing = await files.list("notes")
    assert [(e.name, e.type) for e in listing] == [
        ("a.txt", "file"),
        ("b.bin", "file"),
        ("sub", "directory"),
    ]
    assert listing[1].size == 2
    assert await files.exists("notes/sub") and not await files.exists("notes/none")
    await files.remove("notes")
    assert not await files.exists("notes")
    # The kernel sees what the file API wrote, owned by the sandbox user.
    await files.write("k.txt", "x")
    ex = await py_sandbox.run_python(
        "import os, pwd\npwd.getpwuid(os.stat('k.txt').st_uid).pw_name"
    )
    assert ex.text == "'sandbox'"


async def test_proc_files_that_say_0_bytes_stream_whole(py_sandbox: AsyncSandbox) -> None:
    """/proc's files say 0 bytes and hold some: a streamed read has them whole (E2B's SDK
    reads /proc/sys/kernel/random/boot_id), an empty file stays empty."""
    whole = await py_sandbox.files.read("/proc/sys/kernel/random/boot_id")
    async with await py_sandbox.files.read_stream("/proc/sys/kernel/random/boot_id") as stream:
        streamed = b"".join([piece async for piece in stream])
    assert streamed == whole and len(whole.strip()) == 36  # a UUID
    await py_sandbox.files.write("empty", b"")
    async with await py_sandbox.files.read_stream("empty") as stream:
        assert stream.size == 0 and b"".join([piece async for piece in stream]) == b""


async def test_errors_are_clear(py_sandbox: AsyncSandbox) -> None:
    files = py_sandbox.files
    with pytest.raises(SandboxFileNotFoundError, match=r"missing\.txt"):
        await files.read("missing.txt")
    with pytest.raises(SandboxFileNotFoundError):
        await files.list("nowhere")
    with pytest.raises(SandboxFileNotFoundError):
        await files.remove("nothing")
    await files.write("d/f.txt", "x")
    with pytest.raises(FileOperationError, match="is a directory"):
        await files.read("d")
    with pytest.raises(FileOperationError, match="not a directory"):
        await files.list("d/f.txt")
    with pytest.raises(FileOperationError, match=r"Permission denied|Read-only file system"):
        await files.write("/etc/passwd", "root::0:0::/:/bin/sh\n")
    await files.write("latin.txt", "café".encode("latin-1"))
    with pytest.raises(FileOperationError, match="not valid utf-8"):
        await files.read_text("latin.txt")
    assert await files.read_text("latin.txt", encoding="latin-1") == "café"
