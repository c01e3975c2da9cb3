"""With ipc, the container's main process until it execs the supervisor.

It binds the kernel's five unix sockets once, while the host keeps the run directory
open, and hands the listening descriptors down.  The supervisor holds them across
kernel restarts and every kernel listens on them (ZMQ_USE_FD), so no restart needs
write access to the run directory: the host seals it for the container's life.  The
sockets must be connectable by whichever host user drives the sandbox, so they are
bound with an open umask (the run directory's parent on the host is private to that
user).  Runs with the image's kernel Python (``-I -S``); argv[1:] is the supervisor's
command, ``KERNEL_SANDBOX_SOCKETS`` the five socket paths (comma-separated, in
``PORT_NAMES``' order).

It is on every start's path before the kernel, so it imports nothing but ``os`` and the
C module ``_socket``: ``json`` and ``socket`` (re, enum, selectors) took it from ~9 to
~25 ms of CPU.

In a sandbox made ready for exact snapshots (``KERNEL_SANDBOX_BRIDGED``), the sockets
are bound in the abstract namespace under the same names instead, inside the sandbox
only (a gVisor checkpoint cannot carry a socket the host backs); the host reaches them
through ``bridge.py``, which it starts beside the kernel and stops before a checkpoint.
"""

import os
import sys
from _socket import AF_UNIX, socket

bridged = os.environ.get("KERNEL_SANDBOX_BRIDGED") == "1"  # the launcher reads it too
os.umask(0)
bound = []
for path in os.environ.pop("KERNEL_SANDBOX_SOCKETS").split(","):
    s = socket(AF_UNIX)
    s.bind("\0" + path if bridged else path)
    s.listen(128)
    fd = s.detach()
    os.set_inheritable(fd, True)
    bound.append(f"ipc://{path}={fd}")
os.umask(0o022)
os.environ["KERNEL_SANDBOX_FDS"] = ",".join(bound)
os.execvp("sh", ["sh", *sys.argv[1:]])
