"""Another kernel in a Docker sandbox's container: a context (see ``kernel_sandbox.contexts``).

A context's kernel runs under a supervisor of its own (the same ``supervisor.sh``,
binder first), started beside the sandbox's kernel as the sandbox user, so it shares
the container's files, processes and limits and is restarted in place as the main
kernel is.  With ``ipc`` its sockets, status FIFO and go-aheads live in a directory
of the run directory made for it (``c-<context id>``), open to the container only
while its binder binds and sealed once the host is connected, exactly as the run
directory itself (:class:`~.statedir.HostRunDir`).

The context's supervisor is not the container's main process: the host knows its pid
(printed when it is started) and signals it there, and a kill-all restart of the
sandbox ends it with everything else (the sandbox then starts every context afresh).
The ``tcp`` transport has no directory to share, so contexts need ``ipc`` on Docker.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import TYPE_CHECKING

from ...config import KERNEL_PYTHON
from ...errors import ConfigError, KernelError
from ...kernel.connection import (
    CONTAINER_RUN_DIR,
    ConnectionInfo,
    ipc_socket_names,
    launch_command,
    new_connection_info,
)
from ...kernel.supervisor import KILL_SIGNAL, wait_for_kernel_end
from ..base import ExecResult, HostState, KernelHost, SandboxRecord
from .engine import DockerEngine
from .statedir import HostRunDir

if TYPE_CHECKING:
    from .host import DockerHost

__all__ = ["DockerContextHost"]

#: Seconds between engine checks of the container while a context's kernel runs.
_ENGINE_POLL = 2.0
#: In the directory $1 (exit 3 when there is none), starts the rest (the context's binder
#: and supervisor) in the background and prints its pid.
_START = 'cd -- "$1" 2>/dev/null || exit 3; shift; "$@" </dev/null >/dev/null 2>&1 & echo $!'
#: _START's exit status when the working directory is not one.
_NO_DIRECTORY = 3
# $1: signal, $2: the context supervisor's pid.  Fields after "comm) " in stat: state
# ppid pgrp session; the kernel is the supervisor's child that leads its own session.
_SIGNAL_KERNEL = (
    "for d in /proc/[0-9]*; do k=${d#/proc/}; "
    's=$(cat "$d/stat" 2>/dev/null) || continue; set -- "$1" "$2" ${s##*) }; '
    '[ "$4" = "$2" ] && [ "$6" = "$k" ] && { kill -"$1" "$k"; exit; }; '
    "done; exit 3"
)
# $1: the context supervisor's pid.  Its kernel's group first (found as above; once the
# supervisor is gone the kernel is init's child and could no longer be told apart).
_KILL_CONTEXT = (
    "for d in /proc/[0-9]*; do k=${d#/proc/}; "
    's=$(cat "$d/stat" 2>/dev/null) || continue; set -- "$1" ${s##*) }; '
    '[ "$3" = "$1" ] && [ "$5" = "$k" ] && kill -KILL -"$k"; '
    'done; kill -KILL "$1"; exit 0'
)


class DockerContextHost(KernelHost):
    """One context's kernel in the container of ``parent`` (see the module docstring)."""

    name = "docker"

    def __init__(self, parent: DockerHost, context_id: str, kernel: str, cwd: str) -> None:
        if parent.config.transport != "ipc" or parent.run_dir is None:
            raise KernelError(
                "contexts (several kernels in one sandbox) need transport='ipc' on Docker"
            )
        super().__init__(parent.sandbox_id, parent.config.model_copy(update={"kernel": kernel}))
        self.parent = parent
        self.image, self.resource_id = parent.image, parent.resource_id
        self.cwd = cwd
        self.entry = f"c-{context_id}"
        self._container_info = new_connection_info("ipc", f"{CONTAINER_RUN_DIR}/{self.entry}/k")
        self._info: ConnectionInfo = dict(  # type: ignore[assignment]
            self._container_info, ip=str(parent.run_dir / self.entry / "k")
        )
        self._state: HostRunDir | None = None
        self._pid: int | None = None
        self._engine_checked = 0.0

    async def launch(self) -> ConnectionInfo:
        if self._state is None:
            self.parent.keep_entry(self.entry)
            assert self.parent.run_dir is not None
            self._state = HostRunDir(
                self.parent.run_dir / self.entry, ipc_socket_names(self._container_info)
            )
        else:  # a whole restart: a new binder binds afresh
            self._state.open_for_kernel()
            self._state.container_restarted()
        command, env = launch_command(
            KERNEL_PYTHON,
            self._container_info,
            f"{CONTAINER_RUN_DIR}/{self.entry}",
            self.config.kernel,
        )
        started = await self.parent.exec(
            ["sh", "-c", _START, "sh", self.cwd, *command], env=env, max_output_bytes=64
        )
        if started.exit_code == _NO_DIRECTORY:
            raise ConfigError(f"the context's working directory is not a directory: {self.cwd}")
        pid = started.stdout.decode(errors="replace").strip()
        if started.exit_code != 0 or not pid.isdigit():
            raise KernelError(
                f"the context's kernel could not be started: {started.stderr.decode()[-300:]}"
            )
        self._pid = int(pid)
        return self._info

    async def post_launch(self) -> None:
        if self._state is not None:
            self._state.seal()

    async def poll(self) -> str | None:
        if self._state is None:
            return "the context's kernel was not started"
        end = await self._state.kernel_end()
        if end is not None:
            return HostState(False, end.exit_code, end.oom_killed).death_reason()
        if time.monotonic() - self._engine_checked < _ENGINE_POLL:
            return None
        self._engine_checked = time.monotonic()
        state = await self.parent.state()
        return None if state.running else state.death_reason()

    async def state(self) -> HostState:
        return await self.parent.state()

    async def send_signal(self, signum: int) -> None:
        """Signal the context's kernel (its supervisor's session-leading child)."""
        result = await self.parent.exec(
            ["sh", "-c", _SIGNAL_KERNEL, "sh", str(int(signum)), str(self._pid)],
            max_output_bytes=4096,
        )
        if result.exit_code != 0:
            raise KernelError("could not signal the context's kernel: it is not running")

    async def _signal_supervisor(self, signame: str) -> None:
        result = await self.parent.exec(
            ["kill", f"-{signame}", str(self._pid)], max_output_bytes=4096
        )
        if result.exit_code != 0:
            raise KernelError("the context's supervisor is gone (a kill-all ended it)")

    async def restart_kernel(self, *, kill_all: bool = False) -> ConnectionInfo:
        """Have the context's supervisor kill its kernel and start the next one."""
        state = self._state
        if state is None or self._pid is None:
            raise KernelError("the context's kernel was not started")
        await self._signal_supervisor(KILL_SIGNAL.removeprefix("SIG"))
        await wait_for_kernel_end(state.kernel_end, poll=0.02)
        await state.start_next()
        return self._info

    async def kill(self, restart: bool = False) -> None:
        """End the context's supervisor and its kernel's group (nothing else)."""
        if self._pid is None:
            return
        pid, self._pid = self._pid, None
        await self.parent.exec(["sh", "-c", _KILL_CONTEXT, "sh", str(pid)], max_output_bytes=4096)

    async def cleanup(self, restart: bool = False) -> None:
        if self.parent.resource_id is not None:
            try:
                await self.kill()
            except Exception:  # a container already gone: nothing left to end
                self._pid = None
        if not restart and self._state is not None:
            self._state.close()
            self._state = None
            self.parent.release_entry(self.entry)

    async def logs(self, tail: int) -> str:
        return await self.parent.logs(tail)

    async def exec(
        self,
        argv: list[str],
        *,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        return await self.parent.exec(
            argv,
            workdir=workdir,
            env=env,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            deadline=deadline,
        )

    async def exec_stream(
        self,
        argv: list[str],
        *,
        stdin: AsyncIterable[bytes] | None = None,
        stdout: Callable[[bytes], Awaitable[None]],
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        return await self.parent.exec_stream(
            argv, stdin=stdin, stdout=stdout, max_output_bytes=max_output_bytes, deadline=deadline
        )

    @classmethod
    async def list_sandboxes(cls, labels: dict[str, str]) -> list[SandboxRecord]:
        return await DockerEngine().list(labels)  # the sandboxes, as DockerHost lists them
