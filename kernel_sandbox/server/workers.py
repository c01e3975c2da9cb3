"""``kernel-sandbox serve --workers N``: N server processes behind one port, on one host.

One Python process is bound by its GIL; several use the host's cores.  The supervisor
(the process ``serve`` started) binds the port once, with uvicorn's own
:meth:`uvicorn.Config.bind_socket` (as ``uvicorn --workers`` does), and forks N workers
that all accept on that socket.  Before the first worker starts it applies the restart
policy once (a worker must never remove what another one serves); a worker that dies
is started again (its sandboxes are served meanwhile by the others, see
:mod:`.replicas`); SIGTERM or SIGINT stops the workers gracefully, and then the
supervisor removes every sandbox of the server, as one process does when it stops.
Fork, not spawn: the app holds closures that cannot be pickled, and the supervisor
starts no thread or event loop before it forks (only short-lived children do, for the
policy and the final removal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import replicas
from .restart import remove_leftovers, restorable

if TYPE_CHECKING:
    import uvicorn

    from .settings import ServerSettings

__all__ = ["WORKER_HEADER", "WorkerHeader", "finish_all", "prepare", "run_workers"]

log = logging.getLogger(__name__)

#: Response header naming the worker that answered, with several workers (its pid) or
#: replicas (``host:pid``, the host a replica's pod name).
WORKER_HEADER = "x-kernel-sandbox-worker"
#: A worker that dies sooner than this after its start waits this long before the next.
RESPAWN_PAUSE = 1.0


class WorkerHeader:
    """Adds :data:`WORKER_HEADER` to every response (which worker answered)."""

    def __init__(self, app: ASGIApp, *, replica: bool = False) -> None:
        self.app = app
        pid = str(os.getpid())
        self.value = (f"{socket.gethostname()}:{pid}" if replica else pid).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((WORKER_HEADER.encode(), self.value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


async def prepare(settings: ServerSettings) -> None:
    """Apply the restart policy once, before any worker runs: ``adopt`` keeps (for
    on-demand adoption by the workers) every running sandbox with an owner and a
    notebook, and removes the rest; ``remove`` removes them all; ``keep`` serves none."""
    record_dir = settings.record_dir
    found = await restorable(settings) if settings.on_restart == "adopt" else []
    alive = {(item.owner, item.sandbox_id): item for item in found if item.running}
    for owner, sid, state in replicas.live_states(record_dir):
        if (owner, sid) not in alive:
            replicas.drop(state)
    for owner, sid in alive:
        path = replicas.state_path(record_dir, owner, sid)
        if path is not None:
            replicas.mark_live(path)
    if settings.on_restart != "keep":
        keep = frozenset(item.container_sandbox_id for item in alive.values())
        removed = await remove_leftovers(settings.name, keep)
        if removed:
            log.warning("removed %d sandboxes a previous run left", removed)
    if alive:
        log.warning("kept %d sandboxes a previous run left, for their keys", len(alive))


async def finish_all(settings: ServerSettings) -> None:
    """The whole server stops: every notebook says so, every sandbox is removed."""
    from ..notebook.cells import META_KEY, iso_time
    from ..notebook.shared import locked
    from ..notebook.storage import read_notebook, write_notebook_atomic

    for owner, sid, state in replicas.live_states(settings.record_dir):
        replicas.drop(state)
        path = settings.record_dir / owner / f"{sid}.ipynb"
        try:
            with locked(path):
                nb = read_notebook(path)
                nb.metadata.setdefault(META_KEY, {}).update(
                    {"status": "completed", "reason": "server stopped", "finished_at": iso_time()}
                )
                write_notebook_atomic(nb, path)
        except (OSError, ValueError) as exc:
            log.warning("could not finish the notebook of %s: %s", sid, exc)
    await remove_leftovers(settings.name)


def _in_child(work: Callable[[], object]) -> int:
    """Run ``work`` in a forked child; its exit status (0: it returned)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            work()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def run_workers(
    settings: ServerSettings, make_config: Callable[[], uvicorn.Config], bind: uvicorn.Config
) -> None:
    """Serve with ``settings.workers`` processes until SIGTERM/SIGINT (see the module)."""
    import uvicorn

    sock: socket.socket = bind.bind_socket()
    # a replica's workers are some of the server's processes: neither the restart
    # policy nor the final removal is theirs to apply (see ServerSettings.replica)
    if not settings.replica and _in_child(lambda: asyncio.run(prepare(settings))) != 0:
        raise SystemExit("applying --on-restart failed (see above); nothing was started")
    children: dict[int, float] = {}  # pid -> when it started
    stopping = False

    def spawn() -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - a worker
            code = 0
            try:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                uvicorn.Server(make_config()).run(sockets=[sock])
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        children[pid] = time.monotonic()

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in range(settings.workers):
        spawn()
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        started = children.pop(pid, None)
        if started is None or stopping:
            continue
        log.warning(
            "worker %d ended (%s); starting another", pid, os.waitstatus_to_exitcode(status)
        )
        if time.monotonic() - started < RESPAWN_PAUSE:
            time.sleep(RESPAWN_PAUSE)
        if not stopping:
            spawn()
    sock.close()
    if not settings.replica:
        _in_child(lambda: asyncio.run(finish_all(settings)))
