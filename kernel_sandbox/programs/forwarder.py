"""A byte forwarder inside a sandbox: each connection to LISTEN is carried to CONNECT.

Run *inside the container* with the image's Python (standard library only, Python 3.8+):
``python -c <this file> [--pidfile FILE] LISTEN=CONNECT ...``, where an address is
``tcp:HOST:PORT``, ``unix:PATH`` or ``unix:@NAME`` (the abstract namespace).  It decides
nothing: it is the sandbox's own process and trusted by no one.  Two uses:

* the egress relay: ``tcp:127.0.0.1:PORT=unix:<the host proxy's socket>`` (the container
  has no network but ``lo``; HTTP clients there are pointed at the port, the host's
  proxy decides);
* the kernel's bridge in a sandbox ready for exact snapshots: ``unix:<run dir
  socket>=unix:@<the same name>`` for each of the kernel's five sockets (the binder
  bound the kernel's in the abstract namespace, which a gVisor checkpoint carries); the
  host stops it (``--pidfile``) before a checkpoint and starts it again after a restore.

Every listener is bound first, then the process detaches (so the host's exec returns
once they are ready).  If the first listener is already served — the forwarder runs
after an in-place kernel restart — it exits at once with status 0; a unix socket
nobody answers on (a killed forwarder's) is replaced.  Unix sockets are bound with an
open umask: the host user that drives the sandbox must be able to connect.
"""

from __future__ import annotations  # annotations stay unevaluated (Python 3.8)

import contextlib
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the image's Python may be 3.8
    _Address = tuple[str, int] | str

_CHUNK = 65536
#: Connections carried at once per listener (two threads each); the host proxy caps
#: the egress relay's at 32 too.
_MAX_CONNECTIONS = 32


def _address(text: str) -> tuple[int, _Address]:
    kind, _, rest = text.partition(":")
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        return socket.AF_INET, (host, int(port))
    if kind == "unix" and rest:
        return socket.AF_UNIX, "\0" + rest[1:] if rest.startswith("@") else rest
    raise SystemExit("forwarder: not an address: {!r}".format(text))  # noqa: UP032 (3.8)


def _listen(family: int, address: _Address) -> socket.socket | None:
    """A listening socket, or None when a live one already serves ``address``."""
    server = socket.socket(family, socket.SOCK_STREAM)
    try:
        server.bind(address)
    except OSError:
        if family != socket.AF_UNIX or not isinstance(address, str) or "\0" in address[:1]:
            return None
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(address)
            return None  # answered: served already
        except OSError:
            os.unlink(address)  # a dead forwarder's: bind afresh
            server.bind(address)
        finally:
            probe.close()
    server.listen(64)
    return server


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            chunk = src.recv(_CHUNK)
            if not chunk:
                break
            dst.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _serve(client: socket.socket, target: tuple[int, _Address], slots: Any) -> None:
    upstream = socket.socket(target[0], socket.SOCK_STREAM)
    try:
        upstream.connect(target[1])
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
    except (OSError, RuntimeError):  # RuntimeError: no thread left (pids_limit)
        pass
    finally:
        upstream.close()
        client.close()
        slots.release()


def _accept(server: socket.socket, target: tuple[int, _Address]) -> None:
    slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
    while True:
        client, _ = server.accept()
        if not slots.acquire(blocking=False):
            client.close()
            continue
        try:
            threading.Thread(target=_serve, args=(client, target, slots), daemon=True).start()
        except RuntimeError:  # no thread left (pids_limit): drop this one, keep serving
            client.close()
            slots.release()


def main() -> None:
    args = sys.argv[1:]
    pidfile = None
    if args[:1] == ["--pidfile"]:
        pidfile, args = args[1], args[2:]
    routes: list[tuple[socket.socket, tuple[int, _Address]]] = []
    os.umask(0)
    for pair in args:
        listen, _, connect = pair.partition("=")
        family, address = _address(listen)
        server = _listen(family, address)
        if server is None:
            if not routes:
                print("forwarder already listening on {}".format(listen))  # noqa: UP032
                return
            raise SystemExit("forwarder: {} is taken".format(listen))  # noqa: UP032 (3.8)
        routes.append((server, _address(connect)))
    os.umask(0o022)
    child = os.fork()
    if child:
        if pidfile is not None:
            with open(pidfile, "w") as f:
                f.write(str(child))
        print("forwarder listening on {} as pid {}".format(args[0], child))  # noqa: UP032
        sys.stdout.flush()
        os._exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for server, target in routes[1:]:
        threading.Thread(target=_accept, args=(server, target), daemon=True).start()
    _accept(*routes[0])


if __name__ == "__main__":
    main()
