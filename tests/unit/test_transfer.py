"""Streamed file transfer on the real sandbox code (LocalKernelHost): read_stream,
write_stream, and the upload/download helpers shared with the remote client."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox import files, limits
from kernel_sandbox.backends.base import ExecResult
from kernel_sandbox.errors import FileOperationError, SandboxFileNotFoundError
from kernel_sandbox.events import FileOperated
from tests.waiting import await_for

from .conftest import NewSandbox

MiB = 1024 * 1024


async def _pieces(count: int, size: int = MiB) -> AsyncIterator[bytes]:
    for i in range(count):
        yield bytes([i % 251]) * size


async def test_write_stream_then_read_stream_round_trip(new_sandbox: NewSandbox) -> None:
    sb = await new_sandbox()
    events: list[FileOperated] = []
    sb.listeners.append(lambda e: events.append(e) if isinstance(e, FileOperated) else None)
    written = await sb.files.write_stream("big/data.bin", _pieces(12), max_bytes=20 * MiB)
    assert written == 12 * MiB
    stream = await sb.files.read_stream("big/data.bin", max_bytes=20 * MiB)
    assert stream.size == 12 * MiB
    got = bytearray()
    async for piece in stream:
        assert len(piece) <= 1 << 20  # handed on in pieces, never gathered whole
        got += piece
    assert bytes(got) == b"".join([bytes([i % 251]) * MiB for i in range(12)])
    # no temporary file left beside it
    assert [f.name for f in await sb.files.list("big")] == ["data.bin"]
    kinds = [(e.operation, e.size, e.error) for e in events]
    assert ("write", 12 * MiB, "") in kinds and ("read", 12 * MiB, "") in kinds


async def test_write_stream_past_the_cap_leaves_the_old_file(new_sandbox: NewSandbox) -> None:
    sb = await new_sandbox()
    await sb.files.write("keep.txt", "the old content")
    with pytest.raises(FileOperationError, match="nothing was changed"):
        await sb.files.write_stream("keep.txt", _pieces(3), max_bytes=2 * MiB)
    assert await sb.files.read_text("keep.txt") == "the old content"
    assert [f.name for f in await sb.files.list(".") if f.name.startswith(".keep")] == []


async def test_append_stream_and_refusals(new_sandbox: NewSandbox) -> None:
    sb = await new_sandbox()
    await sb.files.write("log.txt", "a\n")
    assert await sb.files.write_stream("log.txt", _text("b\n", "c\n"), append=True) == 4
    assert await sb.files.read_text("log.txt") == "a\nb\nc\n"
    await sb.files.mkdir("adir")
    with pytest.raises(FileOperationError, match="is a directory"):
        await sb.files.write_stream("adir", _text("x"))
    with pytest.raises(SandboxFileNotFoundError):
        await sb.files.read_stream("missing.bin")
    with pytest.raises(FileOperationError, match="max_file_bytes"):
        await sb.files.read_stream("log.txt", max_bytes=3)


async def test_abandoned_read_stream_stops(new_sandbox: NewSandbox) -> None:
    sb = await new_sandbox()
    await sb.files.write_stream("big.bin", _pieces(8), max_bytes=10 * MiB)
    stream = await sb.files.read_stream("big.bin", max_bytes=10 * MiB)
    async for _ in stream:
        break
    await stream.close()
    # the sandbox is usable at once: nothing holds it
    assert (await sb.run_python("1 + 1")).text == "2"


async def test_a_stalled_reader_holds_at_most_the_stream_queue_on_the_host(
    new_sandbox: NewSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = await new_sandbox()
    await sb.files.write_stream("big.bin", _pieces(16), max_bytes=20 * MiB)
    handed, waiting = 0, False
    streamed = sb.host.exec_stream

    async def counted(
        argv: list[str], *, stdout: Callable[[bytes], Awaitable[None]], **kw: Any
    ) -> ExecResult:
        async def count(piece: bytes) -> None:
            nonlocal handed, waiting
            handed += len(piece)
            waiting = True  # seen by another task only while the put waits for room
            await stdout(piece)
            waiting = False

        return await streamed(argv, stdout=count, **kw)

    monkeypatch.setattr(sb.host, "exec_stream", counted)
    stream = await sb.files.read_stream("big.bin", max_bytes=20 * MiB)
    pieces = aiter(stream)
    got = len(await anext(pieces))
    # the consumer stalls: the sandbox has 16 MiB to give, the host takes a queue's worth
    await await_for(lambda: waiting, timeout=10, what="the host to wait for the stalled reader")
    header = len(b"%d\n" % (16 * MiB))  # the size line the stream starts with (not data)
    held = handed - header - got  # pieces of at most 64 KiB: the queue's and the one waiting
    assert held <= (limits.FILE_STREAM_QUEUE + 1) * 64 * 1024 < 16 * MiB
    async for piece in pieces:  # the sandbox waited: the rest comes whole
        got += len(piece)
    assert got == 16 * MiB


# The sandbox's own code stops (SIGSTOP) the file helper writing a file it names: a
# process of its own user, beside the kernel.  Its children too (the shell's ``cat``).
_STOP_HELPER = """
import os, signal
def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
helpers = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"stalled.bin" in f.read() and int(pid) != os.getpid():
                helpers.append(int(pid))
    except OSError:
        pass
children = [int(p) for p in filter(str.isdigit, os.listdir("/proc"))
            if (s := stat(p)) and int(s[1]) in helpers]
for pid in helpers + children:
    os.kill(pid, signal.SIGSTOP)
print(len(helpers))
"""


async def test_a_file_helper_the_sandbox_stops_holds_the_host_only_to_its_deadline(
    new_sandbox: NewSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 s for the product's 60: a cap raised past 15 minutes outlasts the guard below
    deadline = limits.FILE_OP_DEADLINE / 30
    monkeypatch.setattr(files, "FILE_OP_DEADLINE", deadline)
    sb = await new_sandbox()
    await sb.files.write("stalled.bin", "the old content")
    stopped = ""

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal stopped
        yield b"a" * 1024  # the helper runs: it waits for the rest
        stopped = (await sb.run_python(_STOP_HELPER)).text
        yield b"b" * MiB  # more than a pipe holds: the host's write waits too

    granted = deadline + 4 * MiB / limits.FILE_OP_RATE  # and 4 MiB's transfer
    with pytest.raises(FileOperationError, match=re.escape(f"within {granted:g}s")):
        # the guard only turns a hang into a failure: the deadline ends the call first
        await asyncio.wait_for(
            sb.files.write_stream("stalled.bin", chunks(), max_bytes=4 * MiB), 30
        )
    assert stopped.strip() not in ("", "0"), stopped
    # the host is free, the file as it was, and the sandbox's next transfer works
    assert await sb.files.read_text("stalled.bin") == "the old content"
    assert await sb.files.write_stream("stalled.bin", _text("new")) == 3
    assert [f.name for f in await sb.files.list(".") if f.name.endswith(".part")] == []


async def test_upload_download_helpers(new_sandbox: NewSandbox, tmp_path: Path) -> None:
    sb = await new_sandbox()
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(3 * MiB + 17))
    await sb.files.upload(source, "copy.bin")
    target = tmp_path / "out" / "copy.bin"
    await sb.files.download("copy.bin", target)
    assert target.read_bytes() == source.read_bytes()
    with pytest.raises(SandboxFileNotFoundError):
        await sb.files.download("nope.bin", tmp_path / "out" / "nope.bin")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["copy.bin"]


async def _text(*parts: str) -> AsyncIterator[bytes]:
    for part in parts:
        yield part.encode()


def test_the_blocking_api_streams_too() -> None:
    from kernel_sandbox.sync import Sandbox

    with Sandbox.create(host="local", startup_timeout=120) as sb:
        assert sb.files.write_stream("b.bin", iter([b"ab", b"", b"cd"])) == 4
        with sb.files.read_stream("b.bin") as stream:
            assert stream.size == 4
            assert b"".join(stream) == b"abcd"
        with pytest.raises(FileOperationError, match="nothing was changed"):
            sb.files.write_stream("b.bin", iter([b"x" * 10]), max_bytes=5)
        assert sb.files.read("b.bin") == b"abcd"
