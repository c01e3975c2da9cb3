"""Processes beside the kernel: ``docker exec`` as the sandbox user, output read bounded.

The output is read from the hijacked connection with :mod:`.attach` (which loses no
early frame) into two :class:`~kernel_sandbox.limits.HeadTail` buffers, so a process
printing gigabytes costs the host ``max_output_bytes`` at most.  ``stdin`` is written
from a second thread while the output is read, so neither side waits on a full pipe.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading

import docker
import docker.errors

from ...errors import FileOperationError
from ...limits import HeadTail
from ..base import ExecResult
from .attach import STDERR, TruncatedStreamError, attach_body, read_frames
from .engine import run_in_thread

__all__ = ["exec_process"]


async def exec_process(
    api: docker.APIClient,
    container_id: str,
    argv: list[str],
    *,
    user: str,
    workdir: str | None = None,
    environment: dict[str, str] | None = None,
    stdin: bytes | None = None,
    max_output_bytes: int | None = None,
) -> ExecResult:
    """Run ``argv`` in the container beside the kernel and wait for it."""

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
        # docker-py only opens the stream here; its own frame reader would skip
        # what came in with the response headers (see attach.py), so read it here.
        with api.exec_start(exec_id, stream=True)._response as response:  # type: ignore[attr-defined]
            body = attach_body(response)
            # the process may be silent for longer than the client's timeout;
            # the caller's own deadline (``timeout`` in the container) ends it
            api._disable_socket_timeout(body.raw)  # type: ignore[attr-defined]
            writer = None
            if stdin is not None:
                writer = threading.Thread(target=_feed, args=(body, stdin), daemon=True)
                writer.start()
            for stream, piece in read_frames(body):
                (err if stream == STDERR else out).add(piece)
            if writer is not None:
                writer.join()
        code = api.exec_inspect(exec_id)["ExitCode"]
        return ExecResult(
            int(code if code is not None else -1),
            out.value(),
            err.value(),
            out.dropped + err.dropped,
        )

    try:
        return await run_in_thread(_exec)  # type: ignore[no-any-return]
    except docker.errors.APIError as exc:
        raise FileOperationError(f"could not run a process in the sandbox: {exc}") from exc
    except TruncatedStreamError as exc:
        raise FileOperationError(
            f"the process's output was cut off: {exc}; its side effects may have happened, "
            "so check before running it again"
        ) from exc


def _feed(body: object, data: bytes) -> None:
    """Write ``data`` to the process's stdin, then close only our sending side.

    The engine closes the process's stdin when the connection is half-closed; a process
    that exits without reading it all ends the write with an error, which is its right.
    """
    sock = _socket_of(body)
    with contextlib.suppress(OSError):
        sock.sendall(data)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _socket_of(body: object) -> socket.socket:
    """The socket under the buffered reader of a hijacked response (``SocketIO._sock``)."""
    raw = getattr(body, "raw", None)
    sock = getattr(raw, "_sock", None)
    if not isinstance(sock, socket.socket):
        raise FileOperationError("the engine's exec connection has no socket to write to")
    return sock
