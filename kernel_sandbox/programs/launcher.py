"""The kernel: ipykernel, started by the supervisor inside the sandbox.

It reads its connection info from the environment, binds to the sockets the binder
made (ipc) instead of making new ones, and bounds what streams send at once.  Runs
with the image's kernel Python, as a child of the supervisor.
"""

from __future__ import annotations  # annotations stay unevaluated (older kernel Pythons)

import contextlib
import functools
import gc
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

# No cyclic garbage collection while the kernel starts: importing ipykernel ran the
# collector ~90 times (its ~37k objects), ~10 ms of CPU per start; on again before the
# first cell.
gc.disable()
connection = os.environ.pop("KERNEL_SANDBOX_CONNECTION")
fd, path = tempfile.mkstemp(prefix="kernel-", suffix=".json")
os.write(fd, connection.encode())
os.close(fd)
# tcp: every socket the kernel binds is a CURVE server (encrypted; a peer must know the
# server's key), whichever ipykernel the image has.
curve = json.loads(connection).get("curve_secretkey", "").encode()
# ipc: bind to the sockets the binder made (see binder.py) instead of making new ones.
_fds = os.environ.pop("KERNEL_SANDBOX_FDS", "")
prebound = dict(item.rsplit("=", 1) for item in _fds.split(",") if item)


#: Messages each kernel socket queues for a peer that reads slower than the kernel sends.
#: ZMQ's default (1000) let iopub hold ~1 GB of 1 MiB stream messages inside the sandbox
#: while the host was slow, enough to get the kernel killed as out of memory.
SEND_QUEUE = 16
#: The IOPub sockets (by id): every thread may send on them, under ``_lock`` below.
_shared: set[int] = set()


def _bind(
    self: zmq.Socket[Any],
    addr: str,
    _bind: Callable[[zmq.Socket[Any], str], Any] = zmq.Socket.bind,
) -> Any:
    self.sndhwm = SEND_QUEUE
    if self.type in (zmq.PUB, zmq.XPUB) and hasattr(zmq, "XPUB_NODROP"):
        # At the bound a PUB socket would drop messages (output, the idle status) without
        # a word; instead the IOPub thread's send waits for the host, so a slow host
        # slows the kernel's output (writers wait for each 1 MiB flush, below) and loses
        # nothing.  A peer that stops reading is cut by the host's guard, which frees it.
        self.setsockopt(zmq.XPUB_NODROP, 1)
    if self.type in (zmq.PUB, zmq.XPUB):
        _shared.add(id(self))
    if curve:
        self.curve_secretkey = curve
        self.curve_publickey = zmq.curve_public(curve)
        self.curve_server = True
    if addr in prebound:
        self.set(zmq.USE_FD, int(prebound[addr]))
    return _bind(self, addr)


zmq.Socket.bind = _bind  # type: ignore[method-assign]


# jupyter_client's package __init__ imports every client and manager it has (provisioning,
# entry points, kernelspecs: 36 modules, ~10 ms of CPU per start), while the kernel needs
# only its connect and session modules.  The package goes into sys.modules without
# running its __init__; a name the kernel asks of it comes from the light module that
# has it, and any other name (user code: jupyter_client.KernelManager) runs the real
# __init__ first, so the package behaves as always, only later.
def _lean_package(name: str, light: dict[str, str], modules: tuple[str, ...]) -> None:
    spec = importlib.util.find_spec(name)
    loader = spec.loader if spec is not None else None
    if spec is None or loader is None or name in sys.modules:
        return
    package = importlib.util.module_from_spec(spec)
    namespace = vars(package)

    def __getattr__(attr: str) -> object:
        try:
            module = light.get(attr)
            if module is None and not attr.startswith("__"):
                for candidate in modules:
                    if attr in getattr(importlib.import_module(candidate), "__all__", ()):
                        module = candidate
                        break
            if module is not None:
                value = getattr(importlib.import_module(module), attr)
                setattr(package, attr, value)
                return value
        except (ImportError, AttributeError):
            pass  # a jupyter_client laid out otherwise: its real __init__ answers
        if attr.startswith("__") and attr not in light:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        if namespace.pop("__getattr__", None) is not None:
            loader.exec_module(package)
        return getattr(package, attr)

    namespace["__getattr__"] = __getattr__
    sys.modules[name] = package


_version = "jupyter_client._version"
_lean_package(
    "jupyter_client",
    {
        "BlockingKernelClient": "jupyter_client.blocking",  # a trait default of the app
        "__version__": _version,
        "version_info": _version,
        "protocol_version": _version,
        "protocol_version_info": _version,
    },
    ("jupyter_client.connect",),
)
# Without debugpy ipykernel starts ~100 ms sooner (no debugger: nobody attaches one to a
# sandbox); user code can still import debugpy afterwards.
sys.modules["debugpy"] = None  # type: ignore[assignment]
# -- IOPub: sent by the thread that has the message ------------------------------------
# Stock ipykernel hands every IOPub message to its IOPub thread (a zmq wake-up and a
# thread switch each), and every flush from the main thread waits for a round trip
# through that thread even when the stream holds nothing: 12 wake-ups of it for a
# print(1+1), about half the kernel's CPU per call (bench/profile_roundtrip.py).  Here a
# thread sends on the IOPub socket itself, under one lock, whenever nothing it handed the
# IOPub thread is still waiting there, so messages leave in the order they were sent; a
# flush then runs in the caller's thread.  The IOPub thread stays for what it is for: the
# 0.2 s timer flushes of a long cell, output piped from forked children, the welcome of
# a new subscriber, and a send while an earlier hand-off waits (that one is handed over
# too).  KERNEL_SANDBOX_IOPUB=thread (in the sandbox's env_vars) keeps ipykernel's own
# path, hand-offs and all.
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from types import FrameType  # noqa: E402

from ipykernel.iostream import IOPubThread, OutStream  # noqa: E402
from ipykernel.ipkernel import IPythonKernel  # noqa: E402
from ipykernel.kernelapp import IPKernelApp  # noqa: E402 (after the debugpy stub)
from jupyter_client.session import Session  # noqa: E402
from zmq.eventloop.zmqstream import ZMQStream  # noqa: E402

_DIRECT = os.environ.pop("KERNEL_SANDBOX_IOPUB", "direct") != "thread" and hasattr(
    IOPubThread, "_really_send"
)
#: Held by whoever uses the IOPub socket (any thread) or rotates a stream's buffer to send it.
_lock = threading.RLock()
#: Sends and flushes handed to the IOPub thread that it has not finished.
_handed = [0]
#: In the main thread, SIGINT is held while a message is half sent (see _whole).
_holding = [False]


#: This process's id, kept: ipykernel asks os.getpid() (a system call each) whether it
#: is in a forked child ~20 times a cell (each send and flush); updated in a child.
_pid = [os.getpid()]


def _after_fork() -> None:
    global _lock
    _lock = threading.RLock()  # a lock held by another thread at fork is never released
    _pid[0] = os.getpid()
    _handed[0] = 0
    _holding[0] = False


os.register_at_fork(after_in_child=_after_fork)
# signal.signal without its enum conversions (for a Python function handler each costs a
# ValueError raised and caught): _whole swaps the handler twice for every message sent.
_set_handler: Callable[[int, Any], Any] = getattr(
    importlib.import_module("_signal"), "signal", signal.signal
)


class _whole:
    """Holds a SIGINT (an interrupt) in the main thread until a send or flush is done.

    The IOPub thread never saw KeyboardInterrupt; the main thread does, and one raised
    between two frames of a message would leave it half sent, or a stream's text rotated
    out and never sent.  The interrupt is raised as soon as the message is out.
    """

    def __enter__(self) -> _whole:
        self.caught: list[FrameType | None] = []
        self.swapped = not _holding[0] and threading.current_thread() is threading.main_thread()
        if self.swapped:
            # None: a handler not set from Python; put back as the default one
            self.previous: Any = _set_handler(signal.SIGINT, self._hold)
            _holding[0] = True
        return self

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append(frame)

    def __exit__(self, *exc: object) -> None:
        if not self.swapped:
            return
        if self.previous is None:
            self.previous = signal.default_int_handler
        _set_handler(signal.SIGINT, self.previous)
        _holding[0] = False
        if not self.caught:
            return
        if callable(self.previous):
            self.previous(signal.SIGINT, self.caught[0])
        elif self.previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def _direct(iopub: IOPubThread) -> bool:
    """May this thread use the IOPub socket itself (the caller holds ``_lock``)?"""
    here = threading.current_thread()
    return here is iopub.thread or not _handed[0]


def _send_multipart(
    self: IOPubThread,
    *args: Any,
    _really_send: Callable[..., Any] = IOPubThread._really_send,
    **kwargs: Any,
) -> Any:
    if _DIRECT and self.thread.is_alive() and self._is_master_process():  # type: ignore[no-untyped-call]
        with _lock:
            if _direct(self):
                with _whole():
                    _really_send(self, *args, **kwargs)
                    if threading.current_thread() is not self.thread:
                        _subscriptions(self)
                return None
    # Handed to the IOPub thread.  With iopub's send queue bounded and waiting
    # (SEND_QUEUE above), that thread waits for a slow host; what other threads hand it
    # would pile up in its list of pending events without bound, so a sender waits while
    # that list is long and keeps the host's pace too; after a stall of _PENDING_WAIT
    # seconds (nobody reads: the host's guard cuts such a connection) it goes on, as a
    # stream's flush does after its own 10 s timeout.
    events = getattr(self, "_events", None)
    if events is not None and threading.current_thread() is not self.thread:
        deadline = time.monotonic() + _PENDING_WAIT
        while self.thread.is_alive() and len(events) > _PENDING and time.monotonic() < deadline:
            time.sleep(0.001)
    with _lock:
        _handed[0] += 1

    def send() -> None:
        try:
            with _lock:
                _really_send(self, *args, **kwargs)
        finally:
            with _lock:
                _handed[0] -= 1

    self.schedule(send)  # type: ignore[no-untyped-call]
    return None


def _subscriptions(iopub: IOPubThread) -> None:
    """Answer subscriptions a send of this thread took in (the IOPub thread's poller is
    woken by the socket's descriptor, which such a send may have consumed)."""
    socket, handle = iopub.socket, getattr(iopub, "_handle_subscription", None)
    with contextlib.suppress(zmq.Again):
        while handle and socket is not None and socket.get(zmq.EVENTS) & zmq.POLLIN:
            handle(socket.recv_multipart(zmq.NOBLOCK))


def _locked_events(
    self: ZMQStream,
    *args: Any,
    _handle: Callable[..., Any] = ZMQStream._handle_events,
) -> Any:
    """A thread's poller uses a socket other threads send on only under its lock."""
    if id(self.socket) not in _shared:
        return _handle(self, *args)
    with _lock:
        return _handle(self, *args)


def _flush_here(self: OutStream, _flush: Callable[[OutStream], Any] = OutStream.flush) -> Any:
    pub = self.pub_thread
    here = threading.current_thread()
    if _DIRECT and pub is not None and pub.thread.is_alive() and here is not pub.thread:
        if not self._buffers and self.echo is None and not _handed[0]:
            # nothing written since the last flush and nothing handed over to wait for:
            # ipykernel flushes both streams twice a cell, three of the four empty
            return None
        if not self._is_master_process():
            return _flush(self)
        with _lock:
            if _direct(pub):
                with _whole():
                    self._flush()
                return None
        with _lock:
            _handed[0] += 1
        try:
            return _flush(self)  # hands _flush to the IOPub thread and waits for it
        finally:
            with _lock:
                _handed[0] -= 1
    return _flush(self)


def _locked_flush(self: OutStream, _flush: Callable[[OutStream], Any] = OutStream._flush) -> Any:
    """Takes a stream's text and sends it as one step: no other send gets between."""
    with _lock:
        return _flush(self)


def _schedule_flush_once(
    self: OutStream, _schedule: Callable[[OutStream], Any] = OutStream._schedule_flush
) -> Any:
    """A stream's 0.2 s flush timer, armed in the IOPub thread only when none is armed.

    Stock ipykernel hands the IOPub thread a new timer at a cell's first write, and the
    cell's end flushes the stream before it fires: a print(1+1) woke that thread twice
    (to arm the timer, and 0.2 s later to flush nothing).  Here a timer stays armed until
    it fires; a write while one is armed needs none of its own (the timer, due in at most
    0.2 s, flushes it), so back-to-back cells arm one per 0.2 s instead of one each.
    """
    pub = self.pub_thread
    if not _DIRECT or pub is None or not pub.thread.is_alive():
        return _schedule(self)
    if self._flush_pending:
        return None
    self._flush_pending = True
    state = vars(self)
    if state.get("_ks_timer"):  # cleared by the timer before it flushes: see _fire
        return None
    state["_ks_timer"] = True

    def _fire() -> None:
        state["_ks_timer"] = False
        self._flush()

    pub.schedule(lambda: self._io_loop.call_later(self.flush_interval, _fire))
    return None


# -- Shell: read and answered by the main thread -----------------------------------------
# ipykernel 7 reads the shell socket in a shell-channel thread (for subshells) and hands
# every request to the main thread through an inproc pair, and every reply back the same
# way: two more thread wake-ups, a header parsed and two inproc hops per request, for a
# kernel that one client drives one cell at a time.  Here the main thread reads the
# shell socket on its own loop, as ipykernel 7 does when it has no shell-channel thread
# (ipykernel 6's way; kernel_info then offers no "kernel subshells", and a
# create_subshell_request is refused), and sends each reply on the socket at once, so it
# leaves before the idle status.  A failed cell's reply is the exception: it leaves after
# the requests the client sent before it (queued behind the cell) have been taken in to
# be aborted (stop_on_error), with the idle status; sent sooner, the client's next request
# could arrive in time to be aborted too (as ipykernel without that thread may do under
# load: its abort sends the reply, then reads).  KERNEL_SANDBOX_IOPUB=thread keeps
# ipykernel's threads, subshells and all.
def _send_now(stream: ZMQStream, msg: Any, *args: Any, **kwargs: Any) -> None:
    """A reply on the shell socket now (ZMQStream would queue it for its next turn)."""
    socket = stream.socket
    if socket is None or vars(stream).pop("_ks_failed", False):
        ZMQStream.send_multipart(stream, msg, *args, **kwargs)
        return
    kwargs.pop("callback", None)
    with _whole():
        socket.send_multipart(msg, *args, **kwargs)
    events: Any = socket.get(zmq.EVENTS)
    if events & zmq.POLLIN:  # a request the send took the wake-up of
        stream.io_loop.add_callback(stream._handle_events, socket, 0)


async def _do_execute(
    self: IPythonKernel, *args: Any, _stock: Any = IPythonKernel.do_execute, **kwargs: Any
) -> Any:
    reply = await _stock(self, *args, **kwargs)
    stream = self.shell_stream
    if stream is not None and reply.get("status") == "error":
        vars(stream)["_ks_failed"] = True  # its reply goes the stock way (_send_now)
    return reply


def _abort_queues(
    self: IPythonKernel, *args: Any, _stock: Any = IPythonKernel._abort_queues, **kwargs: Any
) -> Any:
    stream = self.shell_stream
    if stream is None:
        return _stock(self, *args, **kwargs)
    # ipykernel's flush here would also send the failed cell's reply, and could then take
    # in a request the client sent on seeing it: only what came before is taken in here
    stream.flush = functools.partial(ZMQStream.flush, stream, zmq.POLLIN)  # type: ignore[method-assign]
    try:
        return _stock(self, *args, **kwargs)
    finally:
        del stream.flush


def _init_kernel(self: IPKernelApp, _init: Callable[..., Any] = IPKernelApp.init_kernel) -> Any:
    unused = getattr(self, "shell_channel_thread", None)
    if not _DIRECT or unused is None or unused.is_alive():
        return _init(self)
    self.shell_channel_thread = None
    unused.io_loop.close(all_fds=True)
    IPythonKernel.do_execute = _do_execute  # type: ignore[method-assign]
    IPythonKernel._abort_queues = _abort_queues  # type: ignore[method-assign,assignment]
    done = _init(self)
    stream = self.kernel.shell_stream
    if stream is not None:
        stream.send_multipart = functools.partial(_send_now, stream)
    return done


IPKernelApp.init_kernel = _init_kernel  # type: ignore[method-assign]

_PENDING = SEND_QUEUE
_PENDING_WAIT = 10.0

# In a sandbox ready for exact snapshots, the pipe that carries forked processes' output
# to the IOPub thread is an abstract unix socket instead of ipykernel's TCP port on
# 127.0.0.1: gVisor's checkpoint cannot carry a listening TCP endpoint.
_PIPE = f"ipc://@kernel-sandbox-iopub-pipe-{os.getpid()}"


def _setup_pipe_in(self: IOPubThread) -> None:
    self._pipe_uuid = os.urandom(16)
    pipe_in = self.socket.context.socket(zmq.PULL)
    pipe_in.linger = 0
    pipe_in.bind(_PIPE)
    self._pipe_in = ZMQStream(pipe_in, self.io_loop)
    self._pipe_in.on_recv(self._handle_pipe_msg)


def _setup_pipe_out(self: IOPubThread) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx = zmq.Context()  # a new one after fork, as ipykernel's own
    pipe_out = ctx.socket(zmq.PUSH)
    pipe_out.linger = 3000
    pipe_out.connect(_PIPE)
    return ctx, pipe_out


if os.environ.get("KERNEL_SANDBOX_BRIDGED") == "1":
    IOPubThread._setup_pipe_in = _setup_pipe_in  # type: ignore[method-assign]
    IOPubThread._setup_pipe_out = _setup_pipe_out  # type: ignore[method-assign]


def _is_master_process(self: IOPubThread | OutStream) -> bool:
    return _pid[0] == self._master_pid


def _msg_id(self: Session) -> str:
    number = self.message_count
    self.message_count += 1
    return f"{self.session}_{_pid[0]}_{number}"


IOPubThread.send_multipart = _send_multipart  # type: ignore[method-assign]
_stock_msg_id = getattr(getattr(vars(Session).get("msg_id"), "fget", None), "__code__", None)
if _DIRECT:
    IOPubThread._is_master_process = _is_master_process  # type: ignore[method-assign]
    OutStream._is_master_process = _is_master_process  # type: ignore[method-assign]
    # the same ids ("{session}_{pid}_{number}"), where jupyter_client makes them so
    if {"getpid", "message_count"} <= set(getattr(_stock_msg_id, "co_names", ())):
        Session.msg_id = property(_msg_id)  # type: ignore[method-assign,assignment]
ZMQStream._handle_events = _locked_events  # type: ignore[method-assign]
OutStream.flush = _flush_here  # type: ignore[method-assign]
OutStream._flush = _locked_flush  # type: ignore[method-assign]
OutStream._schedule_flush = _schedule_flush_once  # type: ignore[method-assign]


app = IPKernelApp.instance()
# Input history in an in-memory sqlite database, as nbclient asks of its kernels: a
# history_request (tail, range, search: a console's up arrow) answers as on a stock
# kernel, with no history file (and no thread writing one after every cell); the
# outputs IPython would keep beside it are dropped below.  No fixed 0.5 ms sleep after
# each cell.  The client's own kernel arguments (the provisioner filtered them) come
# last, so they win: --HistoryManager.hist_file=PATH keeps history in a sandbox file
# (traitlets refuses an option given twice, so a default the client sets is left out).
_client_args = [str(a) for a in json.loads(os.environ.pop("KERNEL_SANDBOX_KERNEL_ARGS", "[]"))]
_given = {arg.split("=", 1)[0] for arg in _client_args}
_defaults = ["--HistoryManager.hist_file=:memory:", "--IPythonKernel._execute_sleep=0"]
app.initialize(
    ["-f", path, *(a for a in _defaults if a.split("=", 1)[0] not in _given), *_client_args]
)
app.log.setLevel("WARNING")
# ipykernel sends what a stream got in 0.2 s as one message: a tight print loop made
# messages of hundreds of MB, held whole in the kernel and then on the host.  Here a
# stream flushes every 1 MiB and waits for the send, so messages stay small and a
# writer cannot outrun the sender (the host caps what it keeps: max_output_bytes).


def _bounded_write(
    self: OutStream,
    string: str,
    _write: Callable[[OutStream, str], int | None] = OutStream.write,
    _chunk: int = 1 << 20,
) -> int | None:
    if not isinstance(string, str) or len(string) <= _chunk:
        written = _write(self, string)  # None in a forked child: keep that
        state = vars(self)  # what was written since the last flush is kept on the stream
        state["_ks_pending"] = pending = state.get("_ks_pending", 0) + len(string)
        if pending > _chunk:
            state["_ks_pending"] = 0
            self.flush()
        return written
    for start in range(0, len(string), _chunk):
        _bounded_write(self, string[start : start + _chunk])
    return len(string)


OutStream.write = _bounded_write  # type: ignore[method-assign]
del sys.modules["debugpy"]


# A cell that closes sys.stdout/sys.stderr or sets them to None (or anything without a
# write method) would break every later cell (IPython fails before running one and never
# replies).  After each cell such a stream is replaced by a fresh one; a stream the user
# swapped for a working object of their own is left alone.  A few attribute reads a cell.
def _restore_streams() -> None:
    from ipykernel.iostream import OutStream

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if getattr(stream, "closed", False) or not callable(getattr(stream, "write", None)):
            setattr(sys, name, OutStream(app.session, app.iopub_thread, name, watchfd=False))


shell = app.shell
assert shell is not None  # initialize() made it


# IPython 9 keeps every output of the session for %notebook: each printed string,
# display bundle and traceback, for good (input history, above, is only the cells'
# text).  A gigabyte printed in 1 MB strings peaked at ~1 GB in the kernel (tracemalloc:
# the write() arguments, held by history_manager.outputs).  Nothing is kept here.
if TYPE_CHECKING:
    _Outputs = dict[Any, list[Any]]
else:  # a subscripted dict as a base needs CPython 3.9; derived images may have 3.8
    _Outputs = dict


class _KeepNothing(_Outputs):
    def __missing__(self, key: Any) -> list[Any]:
        return []  # appended to, then dropped

    def __setitem__(self, key: Any, value: list[Any]) -> None:
        pass


with contextlib.suppress(Exception):
    shell.history_manager.outputs = _KeepNothing()
    shell.history_manager.exceptions = _KeepNothing()
shell.events.register("post_execute", _restore_streams)


# -- Tracebacks: the same text for a quarter of the CPU ---------------------------------
# A failing cell cost ~12 ms of kernel CPU in IPython 9's traceback (1 + 1: 0.2 ms), most
# of it made again for every traceback: stack_data highlights each frame's code with a
# new lexer class (pygments compiles its ~200 rules per class) and IPython builds a new
# 256-colour formatter and style for each.  Here the lexer class is one, and while
# IPython gathers a traceback's frames the style and formatter for the same options are
# the ones made before (at most _MADE of them).  The text is byte for byte stock's
# (tests/integration/test_kernel_tracebacks.py); an IPython or stack_data laid out
# otherwise keeps its own way.  Set up at the first traceback, not at the kernel's start.
_MADE = 32


def _cheap_records(self: Any, *args: Any, **kwargs: Any) -> Any:
    import inspect
    import linecache

    import stack_data.core
    from pygments import highlight
    from pygments.formatters import terminal256
    from pygments.lexers import get_lexer_by_name

    class RangeLexer(type(get_lexer_by_name("python3"))):  # type: ignore[misc]
        """stack_data's lexer (the executing node's tokens marked), one class for all."""

        def __init__(self, ranges: list[tuple[int, int]], **options: Any) -> None:
            super().__init__(**options)
            self.ranges = ranges

        def get_tokens(self, text: str, unfiltered: bool = False) -> Any:
            length = 0
            for ttype, value in super().get_tokens(text):
                if any(start <= length < end for start, end in self.ranges):
                    ttype = ttype.ExecutingNode
                length += len(value)
                yield ttype, value

    def pygmented_with_ranges(formatter: Any, code: str, ranges: Any) -> list[str]:
        try:
            highlighted = highlight(code, RangeLexer(ranges, stripnl=False), formatter)
        except Exception:  # as stack_data: code without colours rather than no traceback
            highlighted = code
        return str(highlighted).splitlines()

    made: dict[Any, Any] = {}
    stock_style = stack_data.style_with_executing_node  # type: ignore[attr-defined]
    stock_formatter = terminal256.Terminal256Formatter

    def once(make: Callable[..., Any], *args: Any, **options: Any) -> Any:
        key = (make, args, tuple(sorted(options.items())))
        try:
            found = made.get(key)
        except TypeError:  # options that cannot be a key: made each time
            return make(*args, **options)
        if found is None:
            found = make(*args, **options)
            if len(made) < _MADE:
                made[key] = found
        return found

    stock_getmodule = inspect.getmodule

    def getmodule(obj: Any, _filename: str | None = None) -> Any:
        """inspect.getmodule, without its walk of sys.modules for a cell's own frame.

        A frame's file that no module has makes getmodule look at every module in
        sys.modules again (~1 ms with pandas imported) before it answers None; a cell's
        code (IPython's entry in linecache: no mtime) is the file of no module.
        """
        code = getattr(obj, "f_code", None)
        if code is not None and _filename is None:
            entry = linecache.cache.get(code.co_filename)
            cell = entry is not None and len(entry) == 4 and entry[1] is None
            if cell and code.co_filename not in inspect.modulesbyfile:
                return None
        return stock_getmodule(obj, _filename)

    def records(self: Any, *args: Any, **kwargs: Any) -> Any:
        stack_data.style_with_executing_node = lambda *a: once(stock_style, *a)  # type: ignore[attr-defined]
        terminal256.Terminal256Formatter = lambda **o: once(stock_formatter, **o)
        inspect.getmodule = getmodule  # type: ignore[assignment]
        try:
            return stock_records(self, *args, **kwargs)
        finally:
            stack_data.style_with_executing_node = stock_style  # type: ignore[attr-defined]
            terminal256.Terminal256Formatter = stock_formatter
            inspect.getmodule = stock_getmodule

    stock_lines = getattr(stack_data.core, "_pygmented_with_ranges", None)
    names = getattr(getattr(stock_lines, "__code__", None), "co_varnames", ())
    if names[:3] == ("formatter", "code", "ranges"):  # stack_data's layout, as above
        stack_data.core._pygmented_with_ranges = pygmented_with_ranges  # type: ignore[attr-defined]
    ultratb.VerboseTB.get_records = records  # type: ignore[method-assign]
    return records(self, *args, **kwargs)


with contextlib.suppress(Exception):
    from IPython.core import ultratb

    stock_records = ultratb.VerboseTB.get_records
    if "style_with_executing_node" in stock_records.__code__.co_names:
        ultratb.VerboseTB.get_records = _cheap_records  # type: ignore[method-assign]


# ipykernel asks inspect.signature whether IPython's run_cell takes cell_id and cell_meta
# on every execute_request (~40 us a cell); the answer for the same function is kept here
# (for at most _MADE functions: a cell may swap run_cell for its own).
_accepted: dict[Any, dict[str, bool]] = {}


def _accepts_once(meth: Any, names: list[str]) -> dict[str, bool]:
    key = (getattr(meth, "__func__", meth), tuple(names))
    try:
        found = _accepted.get(key)
    except TypeError:  # a callable that cannot be a key: asked each time
        return _accepts(meth, names)  # type: ignore[no-any-return]
    if found is None:
        found = _accepts(meth, names)
        if len(_accepted) < _MADE:
            _accepted[key] = found
    return dict(found)


with contextlib.suppress(Exception):
    from ipykernel import ipkernel

    _accepts = getattr(ipkernel, "_accepts_parameters")  # noqa: B009 (not exported)
    ipkernel._accepts_parameters = _accepts_once  # type: ignore[attr-defined]


# exit() and quit() would stop the kernel 0.1 s *after* it replied "ok", so the next call
# would find it dead and lose every variable; in a sandbox they keep the kernel, as
# exit(keep_kernel=True) does.
shell.ask_exit = lambda: None
os.unlink(path)
for module in os.environ.get("KERNEL_SANDBOX_PREIMPORT", "").split(","):
    if module:
        with contextlib.suppress(Exception):
            shell.run_cell("import " + module, store_history=False, silent=True)
# Code the host asks every start of this kernel to run first (E2B's display conventions:
# programs/e2b_display.py); the cells' own processes do not inherit it.
startup = os.environ.pop("KERNEL_SANDBOX_STARTUP", "")
if startup:
    shell.run_cell(startup, store_history=False, silent=True)
gc.enable()
app.start()
