"""Portable snapshots: made and loaded inside the sandbox, moved as opaque bytes.

To save, the host makes a FIFO in the sandbox's /tmp (as the sandbox user), runs
``cat`` on it beside the kernel with its stdout streamed into the store, and has the
kernel run ``programs/snapshot.py``, which writes the working directory, ``$HOME``
(optionally /tmp) and the user's variables (pickled by ``dill``, one by one) into the
FIFO as a tar stream.  On its way the host counts the bytes and the tar members against
the caps and hashes them; it never parses more of the stream than the members'
headers, and never unpickles anything.  To load, the same in reverse: the blob's bytes
(checked against the digest before the last chunk is let through) go into ``cat >
FIFO`` in a new sandbox, whose kernel reads them.

Everything is bounded: the bytes and entries (:mod:`kernel_sandbox.limits`), the
kernel's report, and the time (the ``cat`` is killed by ``timeout`` in the sandbox, the
host's calls have deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import SnapshotError
from ..kernel.programs import program
from ..limits import (
    MAX_SNAPSHOT_REPORT_BYTES,
    SNAPSHOT_DEADLINE,
    SNAPSHOT_RATE,
)
from .model import Snapshot, bounded_report, new_snapshot_id
from .store import SnapshotStore, read_checked
from .tarcount import TarCounter

if TYPE_CHECKING:
    from ..backends.base import ExecResult, KernelHost

__all__ = ["Restored", "load_snapshot", "take_snapshot"]

#: Runs code in the kernel without history; returns what it printed on stdout.
HiddenRun = Callable[[str, float], Awaitable[str]]
_MARK = "@@kernel-sandbox-snapshot-report@@"


@dataclass(frozen=True)
class Restored:
    """What a restore brought back: ``restored`` names, ``failed`` ones with the reason."""

    snapshot_id: str
    restored: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    files: int = 0
    file_errors: tuple[str, ...] = ()


def _kernel_code(action: str, arguments: dict[str, Any]) -> str:
    """A statement (no displayed value) that runs the program in a private namespace."""
    call = f"\nmain({action!r}, {arguments!r})\n"
    return f"exec({program('snapshot.py') + call!r}, {{'__name__': 'kernel_sandbox_snapshot'}})"


def _report(stdout: str, what: str) -> dict[str, Any]:
    _, mark, tail = stdout.rpartition(_MARK)
    if not mark:
        detail = stdout.strip()[-500:]
        raise SnapshotError(f"the kernel did not {what} the snapshot: {detail or 'no report'}")
    line = tail.split("\n", 1)[0]
    if len(line) > MAX_SNAPSHOT_REPORT_BYTES:
        raise SnapshotError(f"the kernel's report of the {what} is too large")
    try:
        report = json.loads(line)
    except ValueError as exc:
        raise SnapshotError(f"the kernel's report of the {what} is not JSON: {exc}") from exc
    if not isinstance(report, dict):
        raise SnapshotError(f"the kernel's report of the {what} is not an object")
    if "error" in report:
        raise SnapshotError(f"the kernel could not {what} the snapshot: {report['error']}"[:2000])
    return report


def _deadline(size: int) -> float:
    return SNAPSHOT_DEADLINE + size / SNAPSHOT_RATE


async def _fifo(host: KernelHost) -> str:
    path = f"/tmp/.kernel-sandbox-snapshot-{secrets.token_hex(8)}"
    result = await host.exec(["mkfifo", "-m", "600", path], deadline=30)
    if result.exit_code:
        raise SnapshotError(f"cannot make a FIFO in the sandbox: {result.stderr.decode()[-300:]}")
    return path


async def _remove(host: KernelHost, path: str) -> None:
    with contextlib.suppress(Exception):
        await host.exec(["rm", "-f", "--", path], deadline=30)


def _killed_after(seconds: float, argv: list[str]) -> list[str]:
    """``argv`` killed in the sandbox after ``seconds``: a blocked open never stays."""
    return ["timeout", "-s", "KILL", str(int(seconds) + 1), *argv]


async def _together(
    host: KernelHost, fifo: str, pipe: Awaitable[ExecResult], kernel: Awaitable[str]
) -> str:
    """Run the FIFO's other end beside the kernel's program; the kernel's stdout.

    If the pipe fails first (a cap, a digest that does not match), the kernel, which
    may be blocked opening or using the FIFO, is freed at once: the FIFO is opened and
    closed from a process of its own (the kernel reads an end, or writes into nothing)
    and the pipe's error is raised.
    """
    piping, running = asyncio.ensure_future(pipe), asyncio.ensure_future(kernel)
    try:
        await asyncio.wait({piping, running}, return_when=asyncio.FIRST_COMPLETED)
        if piping.done() and piping.exception() is not None and not running.done():
            # both ends at once (whichever the kernel waits on); removed, so that a kernel
            # that opens it only now fails at once
            free = 'exec 3<>"$1"; rm -f -- "$1"; sleep 1'
            with contextlib.suppress(Exception):
                await host.exec(_killed_after(10, ["sh", "-c", free, "sh", fifo]), deadline=20)
        outcome = await asyncio.gather(piping, running, return_exceptions=True)
    except BaseException:
        piping.cancel()
        running.cancel()
        raise
    for failure in outcome:
        if isinstance(failure, BaseException):
            raise failure
    return str(outcome[1])


async def take_snapshot(
    host: KernelHost,
    run_hidden: HiddenRun,
    store: SnapshotStore,
    base: dict[str, Any],
    *,
    places: dict[str, str],
    max_bytes: int,
    max_entries: int,
) -> Snapshot:
    """Save the sandbox into ``store``; ``base`` holds the record's other fields."""
    snapshot_id = new_snapshot_id()
    writer = await store.writer(snapshot_id, "state")
    counter = TarCounter(max_entries)
    digest = hashlib.sha256()
    total = 0
    deadline = _deadline(max_bytes)

    async def sink(piece: bytes) -> None:
        nonlocal total
        total += len(piece)
        if total > max_bytes:
            raise SnapshotError(
                f"the snapshot is larger than {max_bytes:,} bytes (max_bytes; "
                "kernel_sandbox.limits.MAX_SNAPSHOT_BYTES): delete files or variables "
                "in the sandbox, or leave /tmp out"
            )
        counter.feed(piece)
        digest.update(piece)
        await writer.write(piece)

    fifo = await _fifo(host)
    started = time.monotonic()
    try:
        arguments = {
            "fifo": fifo,
            "places": places,
            "skip": list(host.protected_paths),
            "max_files": max_entries,
        }
        reading = host.exec_stream(
            _killed_after(deadline, ["cat", "--", fifo]),
            stdout=sink,
            max_output_bytes=1 << 16,
            deadline=deadline + 10,
        )
        saving = run_hidden(_kernel_code("save", arguments), deadline)
        printed = await _together(host, fifo, reading, saving)
        report = bounded_report(_report(printed, "save"))
        counter.finish()
        await writer.commit()
    except BaseException:
        await writer.abort()
        with contextlib.suppress(Exception):
            await store.delete(snapshot_id)
        raise
    finally:
        await _remove(host, fifo)
    snap = Snapshot(
        id=snapshot_id,
        created=time.time(),
        sizes={
            "bytes": total,
            "entries": counter.entries,
            "variables_bytes": sum(v["bytes"] for v in report["saved"].values()),
            "milliseconds": int((time.monotonic() - started) * 1000),
        },
        digest=digest.hexdigest(),
        saved=report["saved"],
        not_saved=report["not_saved"],
        modules=report["modules"],
        file_errors=report["file_errors"],
        execution_count=report["execution_count"],
        **base,
    )
    await store.put(snap)
    return snap


async def load_snapshot(
    host: KernelHost,
    run_hidden: HiddenRun,
    store: SnapshotStore,
    snap: Snapshot,
    *,
    places: dict[str, str],
) -> Restored:
    """Load ``snap`` into the (new) sandbox of ``host``: files, then variables."""
    deadline = _deadline(snap.sizes.get("bytes", 0))
    fifo = await _fifo(host)
    try:
        writing = host.exec_stream(
            _killed_after(deadline, ["sh", "-c", 'exec cat > "$1"', "sh", fifo]),
            stdin=read_checked(store, snap),
            stdout=_discard,
            max_output_bytes=1 << 16,
            deadline=deadline + 10,
        )
        loading = run_hidden(_kernel_code("load", {"fifo": fifo, "places": places}), deadline)
        printed = await _together(host, fifo, writing, loading)
        report = _report(printed, "load")
    finally:
        await _remove(host, fifo)

    def names(key: str) -> tuple[str, ...]:
        value = report.get(key, [])
        return tuple(str(v)[:300] for v in value[:100_000]) if isinstance(value, list) else ()

    failed = report.get("failed", {})
    files = report.get("files", 0)
    return Restored(
        snapshot_id=snap.id,
        restored=names("restored"),
        failed={str(k)[:300]: str(v)[:300] for k, v in failed.items()}
        if isinstance(failed, dict)
        else {},
        files=files if isinstance(files, int) else 0,
        file_errors=names("errors"),
    )


async def _discard(piece: bytes) -> None:
    """Output of ``cat > FIFO`` (there is none)."""
