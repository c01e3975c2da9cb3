"""The kernel: ipykernel, started by the supervisor inside the sandbox.

It reads its connection info from the environment, binds to the sockets the binder
made (ipc) instead of making new ones, and bounds what streams send at once.  Runs
with the image's kernel Python, as a child of the supervisor.
"""

import contextlib
import json
import os
import sys
import tempfile

import zmq

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


def _bind(self, addr, _bind=zmq.Socket.bind):
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
# Without debugpy ipykernel starts ~100 ms sooner (no debugger: nobody attaches one to a
# sandbox); user code can still import debugpy afterwards.
sys.modules["debugpy"] = None  # type: ignore[assignment]
from ipykernel.kernelapp import IPKernelApp  # noqa: E402 (after the debugpy stub)

app = IPKernelApp.instance()
# No sqlite history (a thread plus a disk write per cell; In, Out and _ still work) and
# no fixed 0.5 ms sleep after each cell; debug records were built and dropped for
# every message.  Together about 3-4 ms of a print(1+1) round trip (bench/).
app.initialize(["-f", path, "--HistoryManager.enabled=False", "--IPythonKernel._execute_sleep=0"])
app.log.setLevel("WARNING")
# ipykernel sends what a stream got in 0.2 s as one message: a tight print loop made
# messages of hundreds of MB, held whole in the kernel and then on the host.  Here a
# stream flushes every 1 MiB and waits for the send, so messages stay small and a
# writer cannot outrun the sender (the host caps what it keeps: max_output_bytes).
from ipykernel.iostream import OutStream  # noqa: E402 (after the app is initialised)


def _bounded_write(self, string, _write=OutStream.write, _chunk=1 << 20):
    if not isinstance(string, str) or len(string) <= _chunk:
        written = _write(self, string)  # None in a forked child: keep that
        self._ks_pending = getattr(self, "_ks_pending", 0) + len(string)
        if self._ks_pending > _chunk:
            self._ks_pending = 0
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


def _paced_send(self, *args, _send=IOPubThread.send_multipart, **kwargs):
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
def _restore_streams():
    from ipykernel.iostream import OutStream

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if getattr(stream, "closed", False) or not callable(getattr(stream, "write", None)):
            setattr(sys, name, OutStream(app.session, app.iopub_thread, name, watchfd=False))


shell = app.shell
assert shell is not None  # initialize() made it


# IPython 9 keeps every output of the session for %notebook (which needs the history
# turned off above anyway): each printed string, display bundle and traceback, for
# good.  A gigabyte printed in 1 MB strings peaked at ~1 GB in the kernel (tracemalloc:
# the write() arguments, held by history_manager.outputs).  Nothing is kept here.
class _KeepNothing(dict):
    def __missing__(self, key):
        return []  # appended to, then dropped

    def __setitem__(self, key, value):
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
app.start()
