"""Test seams: run the real sandbox code without a container engine.

.. warning::

   **LocalKernelHost is NOT a sandbox.**  Its kernel, shell commands and file
   operations run as *your* user, on *your* machine, with *your* files, network and
   environment.  Code run through it can do anything you can do.  Use it for tests and
   development of code that drives sandboxes — never to run code you do not trust,
   never for an agent on a model's say-so.

:class:`LocalKernelHost` runs the kernel (the same ``programs/launcher.py`` the
containers run) as a subprocess of this Python, reached over unix sockets in a private
temporary directory, and runs shell commands as local processes there.  Everything
above the host interface is the real code: ``AsyncSandbox``, its files, the pool, the
manager, the tools, the agent loop and the notebook recorder.  Pick it by name::

    sandbox = await AsyncSandbox.create(host="local")

Relative paths start in a fresh temporary working directory (``host.working_dir``);
absolute paths are the host's own.  Nothing bounds memory, disk or processes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .backends.base import ExecResult, HostState, KernelHost, SandboxRecord
from .errors import FileOperationTimeoutError, KernelError
from .kernel.connection import PORT_NAMES, ConnectionInfo, kernel_command, new_connection_info
from .limits import HeadTail
from .threads import in_thread

if TYPE_CHECKING:
    from .config import SandboxConfig

__all__ = ["LocalKernelHost"]

#: Seconds a killed kernel gets to be reaped before the host gives up waiting.
_REAP_LIMIT = 10.0
#: Bytes read from a pipe at once.
_CHUNK = 64 * 1024

# Hosts whose kernels run now: killed at interpreter exit if nobody cleaned them up
# (their kernels run in their own sessions, so they would outlive this process).
_live: dict[str, LocalKernelHost] = {}


@atexit.register
def _kill_live() -> None:
    for host in list(_live.values()):
        host.kill_blocking()


class LocalKernelHost(KernelHost):
    """Kernels as local subprocesses — for tests and development. NOT A SANDBOX.

    ``python`` is the interpreter that runs the kernel (it needs ipykernel; default:
    this one).  See the module docstring before using it.
    """

    name = "local"

    def __init__(
        self, sandbox_id: str, config: SandboxConfig, *, python: str = sys.executable
    ) -> None:
        super().__init__(sandbox_id, config)
        self.python = python
        self.image = f"local:{python}"
        self._dir = Path(tempfile.mkdtemp(prefix=f"kernel-sandbox-local-{sandbox_id}-"))
        os.chmod(self._dir, 0o700)
        self._work = self._dir / "work"
        self._work.mkdir()
        self._kernel: asyncio.subprocess.Process | None = None
        self._info: ConnectionInfo | None = None
        #: Process groups of shell commands still running (ended by a kill-all restart).
        self._groups: set[int] = set()
        self._created = time.time()
        #: Attached as a guest to another host's kernel: it never kills or restarts it.
        self._guest = False

    @property
    def working_dir(self) -> str:
        """A fresh temporary directory of this host (removed by cleanup)."""
        return str(self._work)

    @property
    def kernel_python(self) -> str:
        """The interpreter the kernels run with (its kernelspecs are the host's)."""
        return self.python

    async def open_context(self, context_id: str, kernel: str, cwd: str) -> KernelHost:
        """Another local kernel process (kernelspec ``kernel``) starting in ``cwd``, with
        the same working directory; its cleanup ends only that kernel."""
        config = self.config.model_copy(update={"kernel": kernel})
        host = LocalKernelHost(f"{self.sandbox_id}-{context_id}", config, python=self.python)
        host._work = Path(cwd)
        return host

    def snapshot_places(self, tmp: bool = False) -> dict[str, str]:
        """Only the working directory: $HOME and /tmp here are the machine's own."""
        return {"work": self.working_dir}

    # -- lifecycle ---------------------------------------------------------------------

    async def launch(self) -> ConnectionInfo:
        if self._info is None:
            self._info = new_connection_info("ipc", str(self._dir / "k"))
        await self._start_kernel()
        return self._info

    async def attach(self, record: SandboxRecord, *, own: bool = True) -> ConnectionInfo:
        """Join, as a guest, a live local kernel of this process (found by its id).

        Local kernels belong to the process that started them (they die with it), so
        there is nothing to adopt: ``own=True`` is refused.
        """
        other = _live.get(record.sandbox_id)
        if own or other is None or other._info is None or other._kernel is None:
            raise KernelError(
                "the local host only attaches as a guest to a live kernel of this process"
            )
        self._guest = True
        self._info, self._kernel, self._work = other._info, other._kernel, other._work
        self.resource_id, self.image = other.resource_id, other.image
        return self._info

    async def _start_kernel(self) -> None:
        assert self._info is not None
        for port in PORT_NAMES:  # a new kernel binds fresh sockets; the client waits for them
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self._info['ip']}-{self._info[port]}")  # type: ignore[literal-required]
        program, kernel_env = kernel_command(self.python, self.config.kernel)
        env = {
            **os.environ,
            **self.config.env_vars,
            **kernel_env,
            "KERNEL_SANDBOX_CONNECTION": json.dumps(self._info),
        }
        with open(self._dir / "kernel.log", "ab") as log:  # the child keeps its own copy
            self._kernel = await asyncio.create_subprocess_exec(
                *program,
                cwd=self._work,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own group: a kill ends what it started too
            )
        self.resource_id = str(self._kernel.pid)
        _live[self.sandbox_id] = self

    async def poll(self) -> str | None:
        state = await self.state()
        return None if state.running else state.death_reason()

    async def state(self) -> HostState:
        kernel = self._kernel
        if kernel is None:
            return HostState(False, error="the kernel was not started")
        code = kernel.returncode
        if code is None:
            return HostState(True)
        return HostState(False, exit_code=128 - code if code < 0 else code)

    async def send_signal(self, signum: int) -> None:
        kernel = self._kernel
        if kernel is None or kernel.returncode is not None:
            raise KernelError("the kernel is not running")
        kernel.send_signal(signum)

    async def restart_kernel(self, *, kill_all: bool = False) -> ConnectionInfo:
        if self._guest:
            raise KernelError("a guest attached to a sandbox cannot restart its kernel")
        await self.kill()
        if kill_all:
            self._kill_groups()
        await self._start_kernel()
        assert self._info is not None
        return self._info

    async def kill(self, restart: bool = False) -> None:
        kernel = self._kernel
        if kernel is None:
            return
        if self._guest:
            raise KernelError("a guest attached to a sandbox cannot kill it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(kernel.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(kernel.wait(), _REAP_LIMIT)

    async def cleanup(self, restart: bool = False) -> None:
        """Kill the kernel and every command left running; remove the directory.

        A guest removes only its own (empty) directory."""
        if self._guest:
            if not restart:
                await in_thread(shutil.rmtree, self._dir, ignore_errors=True)
            return
        await self.kill()
        if restart:
            return
        self._kill_groups()
        _live.pop(self.sandbox_id, None)
        await in_thread(shutil.rmtree, self._dir, ignore_errors=True)

    async def logs(self, tail: int) -> str:
        """The last ``tail`` lines the kernels of this host wrote to stdout and stderr."""
        try:
            text = (self._dir / "kernel.log").read_bytes()[-_CHUNK:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-tail:])

    def kill_blocking(self) -> None:
        """Kill everything this host started, without an event loop (at exit)."""
        if self._kernel is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._kernel.pid, signal.SIGKILL)
        self._kill_groups()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _kill_groups(self) -> None:
        for group in list(self._groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self._groups.clear()

    # -- beside the kernel -------------------------------------------------------------

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
        """Run ``argv`` as a local process in its own session; output kept bounded.

        At ``deadline`` the process group is killed and FileOperationError raised.
        """
        return await self._run(argv, workdir, env, stdin, None, max_output_bytes, deadline)

    async def exec_stream(
        self,
        argv: list[str],
        *,
        stdin: AsyncIterable[bytes] | None = None,
        stdout: Callable[[bytes], Awaitable[None]],
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        """:meth:`exec` with stdin fed chunk by chunk and stdout handed on as it comes."""
        return await self._run(argv, None, None, stdin, stdout, max_output_bytes, deadline)

    async def _run(
        self,
        argv: list[str],
        workdir: str | None,
        env: dict[str, str] | None,
        stdin: bytes | AsyncIterable[bytes] | None,
        sink: Callable[[bytes], Awaitable[None]] | None,
        max_output_bytes: int | None,
        deadline: float | None,
    ) -> ExecResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workdir or self._work,
                env={**os.environ, **self.config.env_vars, **(env or {})},
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:  # no such program or directory, as `docker exec` reports
            return ExecResult(
                126 if isinstance(exc, PermissionError) else 127, b"", str(exc).encode()
            )
        self._groups.add(proc.pid)
        limit = max_output_bytes or sys.maxsize
        out, err = HeadTail(limit), HeadTail(limit)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    _drain(proc.stdout, out.add if sink is None else sink),
                    _drain(proc.stderr, err.add),
                    _feed(proc, stdin),
                ),
                deadline,
            )
            code = await proc.wait()
        except TimeoutError as exc:
            raise FileOperationTimeoutError(
                f"the process did not finish within {deadline:g}s; it was killed"
            ) from exc
        finally:
            if proc.returncode is None:  # timed out, or the caller gave up (cancelled)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                # its pipes may be paused (a reader that left): close them now, not at
                # GC after the loop closed (asyncio has no public handle for this)
                proc._transport.close()  # type: ignore[attr-defined]
            self._groups.discard(proc.pid)
        return ExecResult(
            128 - code if code < 0 else code, out.value(), err.value(), out.dropped + err.dropped
        )

    # -- the "engine" ----------------------------------------------------------------------

    @classmethod
    async def list_sandboxes(cls, labels: dict[str, str]) -> list[SandboxRecord]:
        """The local kernels of this process that carry all of ``labels``."""
        records = []
        for host in list(_live.values()):
            host_labels = host.labels
            if all(host_labels.get(k) == v for k, v in labels.items()):
                running = host._kernel is not None and host._kernel.returncode is None
                records.append(
                    SandboxRecord(
                        host=cls.name,
                        resource_id=host.resource_id or "",
                        name=f"local-{host.sandbox_id}",
                        image=host.image,
                        state="running" if running else "exited",
                        labels=host_labels,
                        created=host._created,
                    )
                )
        return records


async def _drain(
    stream: asyncio.StreamReader, into: Callable[[bytes], Awaitable[None] | None]
) -> None:
    while chunk := await stream.read(_CHUNK):
        if (waiting := into(chunk)) is not None:
            await waiting


async def _feed(
    proc: asyncio.subprocess.Process, data: bytes | AsyncIterable[bytes] | None
) -> None:
    if data is None or proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if isinstance(data, bytes):
            proc.stdin.write(data)
            await proc.stdin.drain()
        else:
            async for chunk in data:
                proc.stdin.write(chunk)
                await proc.stdin.drain()
    proc.stdin.close()
