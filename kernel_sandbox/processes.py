"""Interactive processes beside the kernel: a terminal (or pipes), input at any time.

:meth:`~kernel_sandbox.sandbox.AsyncSandbox.run_shell` runs a command to its end; an
:class:`InteractiveProcess` keeps running while its caller comes back for more: it
writes to the process's terminal, reads what it printed since, sends it signals, and
finds out how it ended.  This is what a coding agent's "PTY" tools need (a REPL, a
long build, a prompt to answer).

The process runs as the sandbox user, through the kernel host's
:meth:`~kernel_sandbox.backends.base.KernelHost.exec_stream`, under
``programs/e2b_process.py`` (the in-sandbox program the E2B API's commands use too):
it starts the command on a fresh terminal (or on pipes), frames its output for the
host and takes input, signals and EOF from a FIFO that each control call writes with
one short ``exec``.  Bounded by construction: output not yet read holds at most
:data:`~kernel_sandbox.limits.PTY_UNREAD_BYTES` on the host, then the process waits as
a writer to a full terminal would; a frame larger than
:data:`~kernel_sandbox.limits.E2B_MAX_FRAME` ends it.  When it ends, its command and a
head-and-tail transcript (``config.max_output_bytes``) are recorded as a shell cell,
so the session's notebook tells what ran.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import posixpath
import secrets
import shlex
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import SandboxError
from .events import ShellExecuted, current_context
from .kernel.programs import program
from .limits import E2B_CONTROL_DEADLINE, E2B_MAX_FRAME, PTY_UNREAD_BYTES, HeadTail
from .results import CommandResult

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox

__all__ = ["InteractiveProcess", "take_frames"]


def take_frames(pending: bytearray, what: str) -> Iterator[tuple[bytes, bytes]]:
    """The whole frames at the head of ``pending`` (``programs/e2b_process.py``'s
    output: a kind byte, a 4-byte big-endian size, the payload), taken out of it; a
    frame past :data:`~kernel_sandbox.limits.E2B_MAX_FRAME` is a broken helper."""
    while len(pending) >= 5:
        size = int.from_bytes(pending[1:5], "big")
        if size > E2B_MAX_FRAME:
            raise SandboxError(f"the {what}'s helper broke its framing: a {size}-byte frame")
        if len(pending) < 5 + size:
            return
        kind, payload = bytes(pending[:1]), bytes(pending[5 : 5 + size])
        del pending[: 5 + size]
        yield kind, payload


log = logging.getLogger(__name__)

_PROGRAM = program("e2b_process.py")
#: Runs the program with the sandbox's Python (the kernel's venv, else ``python3``).
#: Isolated (``-I``): no module of the working directory (the sandbox's) shadows its own.
_RUN = 'p=/opt/venv/bin/python; [ -x "$p" ] || p=python3; exec "$p" -I -c "$0" "$1"'
#: Writes one control line into the process's FIFO, if the process still runs.
_CONTROL = 'test -p "$1" || exit 3; cat > "$1"'


class InteractiveProcess:
    """One process in a sandbox that its caller talks to while it runs.

    ``tty=True`` gives it a terminal of ``size`` (columns, rows): its stdin, stdout and
    stderr, so prompts, line editing and Ctrl-C (``write(b"\\x03")``) behave as in a
    console.  ``tty=False`` gives it pipes: stdout and stderr are read together, and
    ``stdin=True`` adds a stdin pipe.
    """

    def __init__(
        self,
        sandbox: AsyncSandbox,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        tty: bool = False,
        stdin: bool = False,
        size: tuple[int, int] = (80, 24),
    ) -> None:
        self.sandbox = sandbox
        self.argv = [str(a) for a in argv]
        self.cwd = cwd
        self.env = env or {}
        self.tty = tty
        self.stdin = tty or stdin
        self.size = size
        #: The process's id inside the sandbox once started (0: it could not start).
        self.pid = 0
        #: Its exit status once ended (128 + N for a signal N, -1 when it could not run).
        self.exit_code: int | None = None
        #: Why it could not run or be followed, when it could not.
        self.error = ""
        self._ctl = f"/tmp/.kernel-sandbox-pty/{secrets.token_hex(8)}"
        self._pending = bytearray()
        self._unread = bytearray()
        self._changed = asyncio.Event()
        self._room = asyncio.Condition()
        self._started: asyncio.Future[int] | None = None
        self._task: asyncio.Task[None] | None = None
        self._transcript = HeadTail(sandbox.config.max_output_bytes)
        self._written = 0
        self._write_lock = asyncio.Lock()
        self._began = 0.0

    @property
    def ended(self) -> bool:
        """True once the process ended (or could not start)."""
        return self.exit_code is not None

    @property
    def unread(self) -> int:
        """Bytes of output held for the caller (at most about ``PTY_UNREAD_BYTES``)."""
        return len(self._unread)

    async def start(self) -> int:
        """Start the process; its pid once the sandbox reports it."""
        self.sandbox.check_open()
        spec = {
            "cmd": self.argv[0],
            "args": self.argv[1:],
            "envs": self.env,
            "cwd": self.sandbox.resolve_path(self.cwd or "."),
            "pty": list(self.size) if self.tty else None,
            "stdin": self.stdin,
            "ctl": self._ctl,
        }
        self._began = time.time()
        self._started = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(json.dumps(spec)))
        return await asyncio.shield(self._started)

    async def take(self, limit: int | None = None) -> bytes:
        """What it printed since the last ``take``, at most ``limit`` bytes of it (the
        rest stays for the next); the process may go on writing meanwhile."""
        async with self._room:
            cut = len(self._unread) if limit is None else max(0, limit)
            data = bytes(self._unread[:cut])
            del self._unread[:cut]
            if not self.ended and not self._unread:
                self._changed.clear()
            self._room.notify_all()  # a process held by unread output goes on
        return data

    async def wait_output(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for new output or the process's end."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def write(self, data: bytes) -> None:
        """Write ``data`` to the process's terminal (or stdin pipe)."""
        if not self.stdin:
            raise SandboxError("this process has no stdin: start it with tty=True or stdin=True")
        await self._control({"stdin": base64.b64encode(data).decode()})
        self._written += len(data)

    async def close_stdin(self) -> None:
        """End the process's stdin pipe (EOF); a terminal takes ``b"\\x04"`` instead."""
        await self._control({"close": True})

    async def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the process's whole process group."""
        await self._control({"signal": int(signum)})

    async def kill(self) -> None:
        """End the process (SIGKILL to its group) and wait until it is recorded; an
        ended process is only waited for.  Safe twice."""
        if self._task is None:
            return
        if not self.ended and not self.sandbox.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send_signal(signal.SIGKILL), E2B_CONTROL_DEADLINE)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), E2B_CONTROL_DEADLINE)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._end(-1, "killed")  # only if it had not ended

    # -- the host side of programs/e2b_process.py -------------------------------------

    async def _run(self, spec: str) -> None:
        try:
            result = await self.sandbox.host.exec_stream(
                ["sh", "-c", _RUN, _PROGRAM, spec], stdout=self._feed, max_output_bytes=1 << 16
            )
            if result.exit_code != 0 and not self.ended:
                self._end(-1, result.stderr.decode(errors="replace").strip()[-2000:])
        except SandboxError as exc:  # a broken frame too
            self._end(-1, str(exc))
        except asyncio.CancelledError:
            self._end(-1, "killed")
            raise
        except Exception as exc:  # the caller must learn the process ended, whatever happened
            log.exception("interactive process in sandbox %s failed", self.sandbox.id)
            self._end(-1, f"internal error: {type(exc).__name__}")
        finally:
            if not self.ended:
                self._end(-1, "the process's helper ended without its exit status")
            await self._record()

    async def _feed(self, piece: bytes) -> None:
        self._pending += piece
        for kind, payload in take_frames(self._pending, "process"):
            await self._frame(kind, payload)

    async def _frame(self, kind: bytes, payload: bytes) -> None:
        if kind == b"S":
            self.pid = int(payload or b"0")
            if self._started is not None and not self._started.done():
                self._started.set_result(self.pid)
        elif kind == b"X":
            end = json.loads(payload)
            status = str(end.get("status", ""))
            if end.get("exited"):
                self._end(int(end.get("exit_code", -1)), "")
            elif status.startswith("signal: "):
                name = "SIG" + status.removeprefix("signal: ").upper()
                number = signal.Signals[name].value if name in signal.Signals.__members__ else 0
                self._end(128 + number if number else -1, "")
            else:
                self._end(-1, str(end.get("error") or status))
        elif kind in (b"O", b"E", b"P"):
            async with self._room:  # a caller that does not read holds the process
                await self._room.wait_for(lambda: len(self._unread) < PTY_UNREAD_BYTES)
            self._unread += payload
            self._transcript.add(payload)
            self._changed.set()

    def _end(self, code: int, error: str) -> None:
        if self.exit_code is None:
            self.exit_code = code
            self.error = error
        if self._started is not None and not self._started.done():
            self._started.set_exception(SandboxError(f"the process did not start: {error}"))
        self._changed.set()

    async def _record(self) -> None:
        """The process as a shell cell of the session's notebook."""
        if self.sandbox.closed:
            return
        text = self._transcript.value().decode(errors="replace")
        result = CommandResult(
            exit_code=self.exit_code if self.exit_code is not None else -1,
            stdout=text,
            stderr=self.error,
            duration=time.time() - self._began,
            truncated_bytes=self._transcript.dropped,
        )
        meta = {**current_context(), "interactive": "tty" if self.tty else "pipes"}
        if self._written:
            meta["stdin_bytes"] = self._written
        command = self.argv[-1] if self.argv[:1] == ["sh"] and len(self.argv) == 3 else None
        event = ShellExecuted(
            self.sandbox.id, command or shlex.join(self.argv), result, self._began, self.cwd, meta
        )
        with contextlib.suppress(Exception):
            await self.sandbox._emit(event)

    async def _control(self, message: dict[str, object]) -> None:
        if self.ended:
            raise SandboxError(f"process {self.pid} has ended")
        line = json.dumps(message).encode() + b"\n"
        async with self._write_lock:  # whole lines: a FIFO interleaves concurrent writes
            result = await self.sandbox.host.exec(
                ["sh", "-c", _CONTROL, "sh", posixpath.join(self._ctl, "ctl")],
                stdin=line,
                max_output_bytes=4096,
                deadline=E2B_CONTROL_DEADLINE,
            )
        if result.exit_code == 3:
            raise SandboxError(f"process {self.pid} has ended")
