"""envd's ``process.Process`` service: E2B commands, run beside the kernel.

Each command is one process the kernel host runs in the sandbox as the sandbox user
(:meth:`~kernel_sandbox.backends.base.KernelHost.exec_stream`, the same way files
move): ``programs/e2b_process.py`` starts the command (a pipe or a terminal), frames
its stdout, stderr and exit for the host, and takes stdin, signals, EOF and terminal
sizes from a FIFO that each control call writes with one short ``exec``.  So a command
outlives the request that started it (``commands.run(background=True)``, then
``connect``/``send_stdin``/``kill`` by pid), and the host holds only frames in flight:
a subscriber's queue is bounded, and a slow one holds the command's output as a full
pipe would.  Commands end with their sandbox; at most ``E2B_MAX_PROCESSES`` run at once.
As envd's, a command started with a timeout (``Connect-Timeout-Ms``: the SDK's
``timeout``) is killed when it passes and its stream ends ``DEADLINE_EXCEEDED``; the
streams of a sandbox that is killed or paused end ``UNAVAILABLE``, as a lost connection.

The request's ``Authorization: Basic <user>:`` names an E2B user; every command runs as
the sandbox user whatever it names (this server has one user per sandbox).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import posixpath
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from ...errors import SandboxError
from ...kernel.programs import program
from ...limits import (
    E2B_CONTROL_DEADLINE,
    E2B_MAX_PROCESSES,
    E2B_SUBSCRIBER_QUEUE,
)
from ...processes import take_frames
from ..tenancy import Lease
from .envd.process import process_pb as pb
from .envd.process.process_connect import Process, ProcessASGIApplication
from .rpc import CODECS, call_deadline, connect_error, deadline_passed, resolve
from .state import E2bRegistry, E2bSandbox

__all__ = ["Command", "ProcessService", "build_process_app"]

log = logging.getLogger(__name__)

_PROGRAM = program("e2b_process.py")
#: ``sh -c`` line that runs the program with the sandbox's Python (the kernel's venv,
#: else ``python3``); ``$0`` is the program's source, ``$1`` its JSON spec. Isolated (``-I``):
#: no module of the working directory (the sandbox's) runs in place of the program's.
_RUN = 'p=/opt/venv/bin/python; [ -x "$p" ] || p=python3; exec "$p" -I -c "$0" "$1"'
#: Writes one control line into a command's FIFO, if the command still runs.
_CONTROL = 'test -p "$1" || exit 3; cat > "$1"'
#: Seconds between keep-alive events of an idle stream (when the client asks for none).
_KEEPALIVE = 50.0
_Event = pb.ProcessEvent


def _event(kind: str, value: Any) -> _Event:
    return _Event(event=Oneof(field=kind, value=value))  # type: ignore[arg-type]


class Command:
    """One E2B command running in a sandbox."""

    def __init__(
        self,
        record: E2bSandbox,
        lease: Lease,
        config: pb.ProcessConfig,
        tag: str | None,
        pty: tuple[int, int] | None,
        stdin: bool,
    ) -> None:
        self.record = record
        self.lease = lease
        self.config = config
        self.tag = tag
        self.pty = pty
        self.stdin = stdin
        self.pid = 0
        self.ended: _Event | None = None
        #: Its sandbox is going (killed, paused): streams end as a lost connection would.
        self.gone = False
        self._ctl = f"/tmp/.e2b-envd/{secrets.token_hex(8)}"
        self._started = asyncio.get_running_loop().create_future()
        self._subscribers: set[asyncio.Queue[_Event | None]] = set()
        self._pending = bytearray()
        self._write = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._killer: asyncio.Task[None] | None = None

    @property
    def info(self) -> pb.ProcessInfo:
        """The command as ``List`` shows it."""
        return pb.ProcessInfo(config=self.config, pid=self.pid, tag=self.tag)

    async def start(self) -> int:
        """Start the command; its pid once the sandbox reports it."""
        cwd = self.config.cwd if self.config.has_field("cwd") else ""
        spec = {
            "cmd": self.config.cmd,
            "args": list(self.config.args),
            "envs": {**self.record.envs, **dict(self.config.envs)},
            "cwd": self.lease.sandbox.resolve_path(cwd or "."),
            "pty": list(self.pty) if self.pty else None,
            "stdin": self.stdin,
            "ctl": self._ctl,
        }
        self._task = asyncio.create_task(self._run(json.dumps(spec)))
        return await asyncio.shield(self._started)

    async def _run(self, spec: str) -> None:
        host = self.lease.sandbox.host
        error = ""
        try:
            result = await host.exec_stream(
                ["sh", "-c", _RUN, _PROGRAM, spec], stdout=self._feed, max_output_bytes=1 << 16
            )
            if result.exit_code != 0:
                error = result.stderr.decode(errors="replace").strip()[-2000:]
        except SandboxError as exc:  # a broken frame too
            error = str(exc)
        except Exception as exc:  # the command's end must be told whatever happened
            log.exception("E2B command in sandbox %s failed", self.record.id)
            error = f"internal error: {type(exc).__name__}"
        finally:
            self.record.commands.pop(self.pid, None)
            if self._killer is not None:
                self._killer.cancel()
            if not self._started.done():
                self._started.set_exception(
                    ConnectError(Code.INTERNAL, f"the command did not start: {error}")
                )
            if self.ended is None:
                end = pb.ProcessEvent.EndEvent(
                    exit_code=-1, exited=False, status="error", error=error or "ended"
                )
                self.ended = _event("end", end)
                await self._publish(self.ended)
            for queue in list(self._subscribers):
                await queue.put(None)

    async def _feed(self, piece: bytes) -> None:
        """Frames from the program, as they come (``programs/e2b_process.py``)."""
        self._pending += piece
        for kind, payload in take_frames(self._pending, "command"):
            await self._frame(kind, payload)

    async def _frame(self, kind: bytes, payload: bytes) -> None:
        if kind == b"S":
            self.pid = int(payload or b"0")
            if self.pid:
                self.record.commands[self.pid] = self
            if not self._started.done():
                self._started.set_result(self.pid)
            return
        if kind == b"X":
            self.record.commands.pop(self.pid, None)  # gone from List once it ended
            end = json.loads(payload)
            self.ended = _event(
                "end",
                pb.ProcessEvent.EndEvent(
                    exit_code=int(end.get("exit_code", -1)),
                    exited=bool(end.get("exited")),
                    status=str(end.get("status", "")),
                    error=end.get("error") or None,
                ),
            )
            await self._publish(self.ended)
            return
        field = {b"O": "stdout", b"E": "stderr", b"P": "pty"}.get(kind)
        if field is not None:
            data = pb.ProcessEvent.DataEvent(output=Oneof(field=field, value=payload))  # type: ignore[arg-type]
            await self._publish(_event("data", data))

    async def _publish(self, event: _Event) -> None:
        for queue in list(self._subscribers):
            await queue.put(event)  # a slow subscriber holds the command, as a pipe would

    def subscribe(self) -> asyncio.Queue[_Event | None]:
        """A queue of this command's events from now on (None: the stream ended)."""
        queue: asyncio.Queue[_Event | None] = asyncio.Queue(E2B_SUBSCRIBER_QUEUE)
        self._subscribers.add(queue)
        if self.ended is not None:
            queue.put_nowait(None)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[_Event | None]) -> None:
        """Stop delivering events to ``queue`` (its stream was closed)."""
        self._subscribers.discard(queue)

    async def control(self, message: dict[str, Any]) -> None:
        """Send one control line to the command (stdin, EOF, a signal, a size)."""
        line = json.dumps(message).encode() + b"\n"
        async with self._write:  # whole lines: a FIFO interleaves long concurrent writes
            result = await self.lease.sandbox.host.exec(
                ["sh", "-c", _CONTROL, "sh", posixpath.join(self._ctl, "ctl")],
                stdin=line,
                max_output_bytes=4096,
                deadline=E2B_CONTROL_DEADLINE,
            )
        if result.exit_code == 3:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {self.pid} not found")

    def kill_at(self, deadline: float) -> None:
        """Kill the command at ``deadline`` (loop time) unless it ended by then."""

        async def kill() -> None:
            await asyncio.sleep(deadline - asyncio.get_running_loop().time())
            if self.ended is None:
                with contextlib.suppress(Exception):
                    await self.control({"signal": 9})

        self._killer = asyncio.create_task(kill())

    async def stop(self) -> None:
        """Kill the command (its sandbox is going) and stop reading it."""
        self.gone = True
        if self.ended is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.control({"signal": 9}), 5)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


def _find(record: E2bSandbox, selector: pb.ProcessSelector | None) -> Command:
    chosen = selector.selector if selector is not None else None
    if isinstance(chosen, Oneof):
        if chosen.field == "pid":
            command = record.commands.get(int(chosen.value))
            if command is not None:
                return command
            raise ConnectError(Code.NOT_FOUND, f"process with pid {chosen.value} not found")
        for command in record.commands.values():
            if command.tag == chosen.value:
                return command
        raise ConnectError(Code.NOT_FOUND, f"process with tag {chosen.value} not found")
    raise ConnectError(Code.INVALID_ARGUMENT, "a process selector (pid or tag) is required")


def _keepalive(headers: Mapping[str, str]) -> float:
    try:
        return min(max(float(headers.get("keepalive-ping-interval", _KEEPALIVE)), 1.0), 300.0)
    except ValueError:
        return _KEEPALIVE


def _input_bytes(given: pb.ProcessInput | None) -> bytes:
    chosen = given.input if given is not None else None
    return bytes(chosen.value) if isinstance(chosen, Oneof) else b""


def _unstartable(config: pb.ProcessConfig) -> str:
    """Why no process can be started as ``config`` says ('' if one can): a NUL byte in
    a command line, an environment or a path, an environment name that is none."""
    texts = [("cmd", config.cmd), *(("args", arg) for arg in config.args)]
    texts += [("envs", name + value) for name, value in config.envs.items()]
    if config.has_field("cwd"):
        texts.append(("cwd", config.cwd))
    for field, text in texts:
        if "\0" in text:
            return f"process.{field} holds a NUL byte: no command line, environment or path can"
    for name in config.envs:
        if not name or "=" in name:
            return f"process.envs: {name[:64]!r} is not an environment variable name"
    return ""


class ProcessService(Process):
    """The ``process.Process`` Connect service over the E2B registry."""

    def __init__(self, registry: E2bRegistry) -> None:
        self.registry = registry

    async def _sandbox(self, ctx: RequestContext[Any, Any]) -> tuple[E2bSandbox, Lease]:
        return await resolve(self.registry, ctx)

    async def list(
        self, request: pb.ListRequest, ctx: RequestContext[pb.ListRequest, pb.ListResponse]
    ) -> pb.ListResponse:
        """The commands running in the sandbox."""
        record, _ = await self._sandbox(ctx)
        return pb.ListResponse(processes=[c.info for c in record.commands.values() if c.pid])

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[pb.StartRequest, pb.StartResponse]
    ) -> AsyncIterator[pb.StartResponse]:
        """Start a command and stream its events: start (pid), data..., end."""
        record, lease = await self._sandbox(ctx)
        config = request.process
        if config is None or not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        refused = _unstartable(config)
        if refused:
            raise ConnectError(Code.INVALID_ARGUMENT, refused)
        if len(record.commands) >= E2B_MAX_PROCESSES:
            raise ConnectError(
                Code.RESOURCE_EXHAUSTED,
                f"{E2B_MAX_PROCESSES} commands already run in this sandbox (the server's "
                "cap, E2B_MAX_PROCESSES); wait for one to end or kill one",
            )
        pty = None
        if request.pty is not None and request.pty.size is not None:
            pty = (max(1, request.pty.size.cols), max(1, request.pty.size.rows))
        stdin = request.stdin if request.has_field("stdin") else True
        tag = request.tag if request.has_field("tag") else None
        command = Command(record, lease, config, tag, pty, stdin)
        async with self.registry.tenancy.use(record.owner, lease.id):
            queue = command.subscribe()
            try:
                pid = await command.start()
            except SandboxError as exc:
                raise connect_error(exc) from exc
            start = pb.ProcessEvent.StartEvent(pid=pid)
            yield pb.StartResponse(event=_event("start", start))
            # envd's command lives at most the call's timeout (Connect-Timeout-Ms; the
            # SDK's ``timeout``, 60 s unless given, 0: none): past it, it is killed
            deadline = call_deadline(ctx)
            if deadline is not None:
                command.kill_at(deadline)  # whether or not the client still reads
            async for event in _stream(command, queue, _keepalive(ctx.request_headers), deadline):
                yield pb.StartResponse(event=event)

    async def connect(
        self,
        request: pb.ConnectRequest,
        ctx: RequestContext[pb.ConnectRequest, pb.ConnectResponse],
    ) -> AsyncIterator[pb.ConnectResponse]:
        """Follow a running command from now on: start (its pid), data..., end."""
        record, lease = await self._sandbox(ctx)
        command = _find(record, request.process)
        async with self.registry.tenancy.use(record.owner, lease.id):
            queue = command.subscribe()
            start = pb.ProcessEvent.StartEvent(pid=command.pid)
            yield pb.ConnectResponse(event=_event("start", start))
            # the stream ends at the call's timeout; the command runs on (as envd's)
            stream = _stream(command, queue, _keepalive(ctx.request_headers), call_deadline(ctx))
            async for event in stream:
                yield pb.ConnectResponse(event=event)

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[pb.UpdateRequest, pb.UpdateResponse]
    ) -> pb.UpdateResponse:
        """Resize a command's terminal."""
        record, _ = await self._sandbox(ctx)
        command = _find(record, request.process)
        if request.pty is not None and request.pty.size is not None:
            size = request.pty.size
            await command.control({"resize": [max(1, size.cols), max(1, size.rows)]})
        return pb.UpdateResponse()

    async def stream_input(
        self,
        request: AsyncIterator[pb.StreamInputRequest],
        ctx: RequestContext[pb.StreamInputRequest, pb.StreamInputResponse],
    ) -> pb.StreamInputResponse:
        """A stream of input for one command: a start naming it, then data."""
        record, _ = await self._sandbox(ctx)
        command: Command | None = None
        async for message in request:
            chosen = message.event
            if not isinstance(chosen, Oneof):
                continue
            if chosen.field == "start":
                command = _find(record, chosen.value.process)
            elif chosen.field == "data":
                if command is None:
                    raise ConnectError(Code.INVALID_ARGUMENT, "input came before a start event")
                data = _input_bytes(chosen.value.input)
                await command.control({"stdin": base64.b64encode(data).decode()})
        return pb.StreamInputResponse()

    async def send_input(
        self,
        request: pb.SendInputRequest,
        ctx: RequestContext[pb.SendInputRequest, pb.SendInputResponse],
    ) -> pb.SendInputResponse:
        """Write to a command's stdin (or terminal)."""
        record, _ = await self._sandbox(ctx)
        command = _find(record, request.process)
        data = _input_bytes(request.input)
        await command.control({"stdin": base64.b64encode(data).decode()})
        return pb.SendInputResponse()

    async def send_signal(
        self,
        request: pb.SendSignalRequest,
        ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse],
    ) -> pb.SendSignalResponse:
        """SIGTERM or SIGKILL to a command's whole process group."""
        record, _ = await self._sandbox(ctx)
        command = _find(record, request.process)
        number = int(request.signal)
        if number not in (9, 15):
            raise ConnectError(Code.INVALID_ARGUMENT, "signal must be SIGTERM or SIGKILL")
        await command.control({"signal": number})
        return pb.SendSignalResponse()

    async def close_stdin(
        self,
        request: pb.CloseStdinRequest,
        ctx: RequestContext[pb.CloseStdinRequest, pb.CloseStdinResponse],
    ) -> pb.CloseStdinResponse:
        """End a command's stdin (EOF)."""
        record, _ = await self._sandbox(ctx)
        command = _find(record, request.process)
        if command.pty is not None:
            raise ConnectError(
                Code.FAILED_PRECONDITION, "a terminal has no stdin to close: send Ctrl+D (0x04)"
            )
        await command.control({"close": True})
        return pb.CloseStdinResponse()


async def _stream(
    command: Command,
    queue: asyncio.Queue[_Event | None],
    keepalive: float,
    deadline: float | None = None,
) -> AsyncIterator[_Event]:
    """A subscriber's events until the command's end (keep-alives while it is quiet);
    ``DEADLINE_EXCEEDED`` past ``deadline``; ``UNAVAILABLE`` when the sandbox went first
    (as envd's stream breaks with its sandbox: the SDK then asks whether it is gone)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            wait = keepalive
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    raise deadline_passed()
            try:
                event = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                if deadline is None or loop.time() < deadline:
                    yield _event("keepalive", pb.ProcessEvent.KeepAlive())
                continue
            ends = event is None or (isinstance(event.event, Oneof) and event.event.field == "end")
            if ends and command.gone:
                raise ConnectError(
                    Code.UNAVAILABLE,
                    f"the connection to sandbox {command.record.id} ended before the stream "
                    "completed",
                )
            if event is None:
                return
            yield event
            if ends:
                return
    finally:
        command.unsubscribe(queue)


def build_process_app(registry: E2bRegistry, read_max_bytes: int) -> ProcessASGIApplication:
    """The service as an ASGI app (Connect over HTTP/1.1, JSON and protobuf bodies)."""
    return ProcessASGIApplication(
        ProcessService(registry), read_max_bytes=read_max_bytes, codecs=CODECS
    )
