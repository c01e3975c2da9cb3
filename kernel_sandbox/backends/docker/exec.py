"""Processes beside the kernel: ``docker exec`` as the sandbox user, output read bounded.

The output is read from the hijacked connection with :mod:`.attach` (which loses no
early frame) into two :class:`~kernel_sandbox.limits.HeadTail` buffers, so a process
printing gigabytes costs the host ``max_output_bytes`` at most.  ``stdin`` is sent
whole before the output is read (file writes: ``cat`` drains it as it comes), and a
``deadline`` bounds the whole call on the host.

Streamed (:func:`exec_process` with an async iterable ``stdin`` or a ``stdout`` sink):
the worker thread that owns the engine's socket pulls each input chunk from, and hands
each output piece to, the event loop and waits for it there, so the loop's consumer
(an HTTP request body, a response) sets the pace and nothing is gathered on the host.
Cancelling the call shuts the socket and releases the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import socket
import sys
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import docker
import docker.errors

from ...errors import FileOperationError, FileOperationTimeoutError
from ...limits import HeadTail
from ..base import ExecResult, HostState
from .attach import STDERR, TruncatedStreamError, attach_body, read_frames
from .engine import run_in_process_thread

__all__ = ["exec_process"]

T = TypeVar("T")

#: Seconds between checks that a container still runs while a process in it is read.
_EXEC_WATCH = 2.0


async def exec_process(
    api: docker.APIClient,
    container_id: str,
    argv: list[str],
    *,
    user: str,
    workdir: str | None = None,
    environment: dict[str, str] | None = None,
    stdin: bytes | AsyncIterable[bytes] | None = None,
    stdout: Callable[[bytes], Awaitable[None]] | None = None,
    max_output_bytes: int | None = None,
    deadline: float | None = None,
    container_state: Callable[[], Awaitable[HostState]] | None = None,
) -> ExecResult:
    """Run ``argv`` in the container beside the kernel and wait for it.

    ``stdin`` (bytes, or chunks as they come) is sent to the process, then closed;
    with ``stdout`` every output piece is awaited through it instead of kept.  With
    ``deadline`` (seconds) the host stops waiting then and raises
    :class:`FileOperationError`: a process the sandbox can stop (its own user's) must
    never hold the host.  With ``container_state``, the container is watched while the
    process runs (see :func:`_watched`).
    """
    streams: list[Any] = []  # the socket being read, for the watch
    bridge = _Bridge(asyncio.get_running_loop())
    chunks = None if stdin is None or isinstance(stdin, bytes) else aiter(stdin)

    def _exec() -> ExecResult:
        exec_id = api.exec_create(
            container_id,
            argv,
            user=user,
            workdir=workdir,
            environment=environment,
            stdin=stdin is not None,
        )["Id"]
        limit = max_output_bytes or sys.maxsize
        out, err = HeadTail(limit), HeadTail(limit)
        ends = None if deadline is None else time.monotonic() + deadline
        # docker-py only opens the stream here; its own frame reader would skip
        # what came in with the response headers (see attach.py), so read it here.
        with api.exec_start(exec_id, stream=True)._response as response:
            body = attach_body(response)
            sock = _socket_of(body) if stdin is not None or ends is not None else None
            streams.append(sock if sock is not None else getattr(body.raw, "_sock", None))
            if sock is None or ends is None:
                # the process may be silent for longer than the client's timeout;
                # run_shell's own deadline (``timeout`` in the container) ends it
                api._disable_socket_timeout(body.raw)
            else:
                sock.settimeout(deadline)
            if sock is not None and stdin is not None:
                # A process that ends without reading all of it (it refused the
                # work) closes the pipe: its output and status tell why.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    if chunks is None:
                        sock.sendall(stdin)  # type: ignore[arg-type]
                    else:
                        while (chunk := bridge.call(_next(chunks), ends)) is not None:
                            if ends is not None:  # a slow reader must not stretch it
                                sock.settimeout(max(ends - time.monotonic(), 0.001))
                            sock.sendall(chunk)
                    sock.shutdown(socket.SHUT_WR)  # the process reads its end of input
            for stream, piece in read_frames(body):
                if stream == STDERR:
                    err.add(piece)
                elif stdout is None:
                    out.add(piece)
                else:
                    bridge.call(stdout(piece), ends)
                if sock is not None and ends is not None:  # a trickle must not stretch it
                    left = ends - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    sock.settimeout(left)
        code = api.exec_inspect(exec_id)["ExitCode"]
        return ExecResult(
            int(code if code is not None else -1),
            out.value(),
            err.value(),
            out.dropped + err.dropped,
        )

    try:
        if container_state is None:
            return await run_in_process_thread(_exec)  # type: ignore[no-any-return]
        return await _watched(container_state, run_in_process_thread(_exec), streams)
    except asyncio.CancelledError:
        bridge.abandon()
        for sock in streams:  # the thread blocked on the engine wakes up and ends
            with contextlib.suppress(Exception):
                sock.shutdown(socket.SHUT_RDWR)
        raise
    except TimeoutError as exc:  # socket.timeout too
        raise FileOperationTimeoutError(
            f"the process in the sandbox did not finish within {deadline:g}s (stopped or "
            "blocked by sandbox code?); the host stopped waiting for it"
        ) from exc
    except docker.errors.APIError as exc:
        raise FileOperationError(f"could not run a process in the sandbox: {exc}") from exc
    except TruncatedStreamError as exc:
        raise FileOperationError(
            f"the process's output was cut off: {exc}; its side effects may have happened, "
            "so check before running it again"
        ) from exc


async def _watched(
    container_state: Callable[[], Awaitable[HostState]],
    running: Awaitable[ExecResult],
    streams: list[Any],
) -> ExecResult:
    """``running``'s result, or, if the container stops first, exit 137 saying why.

    Under gVisor the engine keeps an exec's stream open for a minute or more after the
    sandbox died (an out-of-memory sandbox loses its whole container there), so the
    container is watched and the stream shut down when it is gone.
    """
    task = asyncio.ensure_future(running)
    while True:
        done, _ = await asyncio.wait({task}, timeout=_EXEC_WATCH)
        if done:
            return task.result()
        state = await container_state()
        if not state.running:
            break
    for sock in streams:
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)
    note = f"the sandbox's container stopped: {state.death_reason()}"
    with contextlib.suppress(Exception):
        result = await task
        return ExecResult(
            137, result.stdout, result.stderr + f"\n[{note}]".encode(), result.truncated_bytes
        )
    return ExecResult(137, b"", note.encode())


class _Bridge:
    """Runs coroutines on the event loop for the worker thread, and waits for them.

    Once :meth:`abandon` was called (the call was cancelled), the one waited for is
    cancelled and no new one starts, so the thread never waits for a consumer gone.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._waiting: concurrent.futures.Future[Any] | None = None
        self._abandoned = False

    def call(self, awaitable: Awaitable[T], ends: float | None) -> T:
        """``awaitable``'s value, computed on the loop; TimeoutError past ``ends``."""
        coro = _awaited(awaitable)
        with self._lock:
            if self._abandoned:
                coro.close()
                raise concurrent.futures.CancelledError
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._waiting = future
        try:
            return future.result(None if ends is None else max(ends - time.monotonic(), 0))
        except TimeoutError:
            future.cancel()
            raise
        finally:
            with self._lock:
                self._waiting = None

    def abandon(self) -> None:
        """Stop: cancel what the thread waits for and refuse what it asks next."""
        with self._lock:
            self._abandoned = True
            if self._waiting is not None:
                self._waiting.cancel()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _next(chunks: AsyncIterator[bytes]) -> bytes | None:
    """The next input chunk, None at the end (empty chunks are skipped)."""
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return None
        if chunk:
            return chunk


def _socket_of(body: io.BufferedReader) -> socket.socket:
    """The socket under an exec stream's reader (to write stdin and bound the waits)."""
    raw: Any = body.raw
    sock = getattr(raw, "_sock", raw)
    if not isinstance(sock, socket.socket):
        raise FileOperationError(
            f"this engine connection ({type(sock).__name__}) cannot carry a process's input"
        )
    return sock
