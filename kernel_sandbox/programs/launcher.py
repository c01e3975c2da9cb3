"""The kernel: ipykernel, started by the supervisor inside the sandbox.

It reads its connection info from the environment, binds to the sockets the binder
made (ipc) instead of making new ones, and bounds what streams send at once.  Runs
with the image's kernel Python, as a child of the supervisor.
"""

from __future__ import annotations  # annotations stay unevaluated (older kernel Pythons)

import contextlib
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
from ipykernel.kernelapp import IPKernelApp  # noqa: E402 (after the debugpy stub)

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
from ipykernel.iostream import OutStream  # noqa: E402 (after the app is initialised)


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

# With iopub's send queue bounded and waiting (SEND_QUEUE above), the IOPub thread waits
# for a slow host; messages other threads hand it (display(), statuses, anything sent on
# the kernel's iopub socket) would pile up in its list of pending events instead, without
# bound.  A sender waits while that list is long, so it keeps the host's pace too; after
# a stall of ``_PENDING_WAIT`` seconds (nobody reads: the host's guard cuts such a
# connection) it goes on, as a stream's flush does after its own 10 s timeout.
import threading  # noqa: E402
import time  # noqa: E402

from ipykernel.iostream import IOPubThread  # noqa: E402

_PENDING = SEND_QUEUE
_PENDING_WAIT = 10.0


def _paced_send(
    self: IOPubThread,
    *args: Any,
    _send: Callable[..., Any] = IOPubThread.send_multipart,
    **kwargs: Any,
) -> Any:
    events = getattr(self, "_events", None)
    elsewhere = threading.current_thread() is not self.thread
    if events is not None and elsewhere and self.thread.is_alive():
        deadline = time.monotonic() + _PENDING_WAIT
        while len(events) > _PENDING and time.monotonic() < deadline:
            time.sleep(0.001)
    return _send(self, *args, **kwargs)


IOPubThread.send_multipart = _paced_send  # type: ignore[method-assign]


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
# exit() and quit() would stop the kernel 0.1 s *after* it replied "ok", so the next call
# would find it dead and lose every variable; in a sandbox they keep the kernel, as
# exit(keep_kernel=True) does.
shell.ask_exit = lambda: None
os.unlink(path)
for module in os.environ.get("KERNEL_SANDBOX_PREIMPORT", "").split(","):
    if module:
        with contextlib.suppress(Exception):
            shell.run_cell("import " + module, store_history=False, silent=True)
gc.enable()
app.start()
