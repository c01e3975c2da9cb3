"""Processes beside the kernel through the pod exec API, read frame by frame within a cap.

The exec API speaks the ``v4.channel.k8s.io`` websocket protocol on v1.20 (``v5``, which
can close stdin, only from v1.29): every frame starts with a channel byte (1 stdout,
2 stderr, 3 the final status as JSON).  The client's own ``WSClient.update`` appends
every frame that is already waiting into one buffer per channel, so a process printing
without pause would grow host memory until it stops; here each frame goes straight into
a :class:`~kernel_sandbox.limits.HeadTail` instead, so a process printing gigabytes costs
the host at most its cap.

v4 cannot close stdin, so input is given to the process through ``head -c N``: it reads
exactly the bytes sent, then closes the pipe, and the process sees its end of file.
The process runs as the pod's user (the sandbox user: exec has no user option), never
as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import sys
import threading
from typing import Any

from kubernetes.stream import stream
from websocket import ABNF, WebSocketException

from ...errors import EngineUnavailableError, FileOperationError, FileOperationTimeoutError
from ...limits import K8S_EXEC_CONNECT_SECONDS, K8S_EXEC_STATUS_BYTES, HeadTail
from ...threads import in_process_thread
from ..base import ExecResult
from .api import API_HELP, ApiException, Kube, removed_error

__all__ = ["K8S_EXEC_STATUS_BYTES", "pod_exec"]

STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
#: Bytes of stdin per websocket frame.
_STDIN_CHUNK = 256 * 1024
#: The end of a failed process's status document: its exit code.  The document's
#: message echoes the whole command line, so a long one (a shell script in argv) is cut
#: in its middle by the cap; its end still tells (in the JSON string before it every
#: quote is escaped, so the command cannot forge it).
_EXIT_CAUSE = re.compile(rb'"causes":\[\{"reason":"ExitCode","message":"(\d+)"\}\]\}\}\s*$')


def _exit_code(status: bytes) -> int:
    """The process's exit status from the v4 status document (``Success``, or a cause),
    also when the document was cut in its middle (see ``_EXIT_CAUSE``)."""
    try:
        doc = json.loads(status or b"{}")
    except ValueError:
        cause = _EXIT_CAUSE.search(status)
        return int(cause.group(1)) if cause else -1
    if doc.get("status") == "Success":
        return 0
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message"))
    return -1


def _feed(ws: Any, data: bytes) -> None:
    """Send ``data`` on the stdin channel in frames; a closed connection ends it quietly."""
    with contextlib.suppress(Exception):
        for start in range(0, len(data), _STDIN_CHUNK):
            ws.send(bytes([STDIN]) + data[start : start + _STDIN_CHUNK], ABNF.OPCODE_BINARY)


class _Exec:
    """One exec: opened, fed and read in a worker thread; ``abort`` from any thread."""

    def __init__(self) -> None:
        self.ws: Any = None
        self.aborted = threading.Event()

    def cancel(self) -> None:
        """The caller gave up: close the connection so the worker thread ends."""
        self.aborted.set()
        self.abort()

    def abort(self) -> None:
        sock = getattr(self.ws, "sock", None)
        raw = getattr(sock, "sock", None)
        if raw is not None:  # wakes a recv blocked in the worker thread
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)

    def run(
        self,
        kube: Kube,
        pod: str,
        namespace: str,
        container: str,
        argv: list[str],
        stdin: bytes | None,
        limit: int,
    ) -> ExecResult:
        if stdin is not None:
            argv = ["sh", "-c", 'head -c "$0" | "$@"', str(len(stdin)), *argv]
        api = kube.ws_core()
        self.ws = stream(
            api.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=container,
            command=argv,
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            tty=False,
            binary=True,
            _preload_content=False,
            _request_timeout=K8S_EXEC_CONNECT_SECONDS,
        )
        if self.aborted.is_set():
            self.abort()
        ws = self.ws.sock
        ws.settimeout(None)  # the process may be silent for long; its own timeout ends it
        sender = None
        if stdin is not None:
            # fed from its own thread: a process that stops reading (it failed, or ended)
            # must not keep this one from reading its output and exit status
            sender = threading.Thread(target=_feed, args=(ws, stdin), daemon=True)
            sender.start()
        try:
            out, err = HeadTail(limit), HeadTail(limit)
            status = HeadTail(K8S_EXEC_STATUS_BYTES)
            while True:
                opcode, frame = ws.recv_data_frame(True)
                if opcode == ABNF.OPCODE_CLOSE:
                    break
                data = frame.data
                if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not data:
                    continue
                channel, payload = data[0], data[1:]
                if channel == STDOUT:
                    out.add(payload)
                elif channel == STDERR:
                    err.add(payload)
                elif channel == STATUS:
                    status.add(payload)
        finally:
            self.abort()  # also ends a sender still blocked on a process that stopped reading
            with contextlib.suppress(Exception):
                ws.close(timeout=1)
            if sender is not None:
                sender.join(5)
        document = status.value()
        if not document:
            raise FileOperationError(
                "the exec stream ended without the process's exit status (the API server or "
                "the kubelet closed it); its side effects may have happened, so check before "
                "running it again"
            )
        return ExecResult(_exit_code(document), out.value(), err.value(), out.dropped + err.dropped)


async def pod_exec(
    kube: Kube,
    pod: str,
    namespace: str,
    container: str,
    argv: list[str],
    *,
    stdin: bytes | None = None,
    max_output_bytes: int | None = None,
    deadline: float | None = None,
) -> ExecResult:
    """Run ``argv`` in the pod's container and wait for it, output capped (see module).

    Cancelling the call, or ``deadline`` seconds passing, closes the connection, so the
    worker thread ends with it; a passed deadline is a :class:`FileOperationError`.
    """
    job = _Exec()
    limit = max_output_bytes or sys.maxsize
    worker = asyncio.ensure_future(
        in_process_thread(job.run, kube, pod, namespace, container, argv, stdin, limit)
    )
    try:
        return await asyncio.wait_for(asyncio.shield(worker), deadline)
    except TimeoutError:
        job.cancel()
        with contextlib.suppress(BaseException):
            await worker
        raise FileOperationTimeoutError(
            f"the process in the sandbox did not finish within {deadline:g}s and was left"
        ) from None
    except asyncio.CancelledError:
        job.cancel()
        with contextlib.suppress(BaseException):
            await worker
        raise
    except ApiException as exc:
        raise _exec_error(exc, kube) from exc
    except FileOperationError:
        raise
    except (WebSocketException, OSError) as exc:
        raise FileOperationError(
            f"the exec stream broke: {exc}; the process's side effects may have happened, so "
            "check before running it again"
        ) from exc


def _exec_error(exc: ApiException, kube: Kube) -> Exception:
    reason = str(exc.reason or exc)
    if "404" in reason:
        return removed_error()
    if "Connection refused" in reason or "timed out" in reason or "Name or service" in reason:
        return EngineUnavailableError(API_HELP.format(where=f" at {kube.host}", error=reason))
    if "container not found" in reason or "400" in reason:
        return FileOperationError(
            f"cannot run a process in the sandbox: its container is not running ({reason})"
        )
    return FileOperationError(f"cannot run a process in the sandbox: {reason}")
