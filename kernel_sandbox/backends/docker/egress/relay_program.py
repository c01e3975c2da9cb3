"""The relay inside a sandbox: 127.0.0.1:PORT -> the host proxy's unix socket.

Run *inside the container* with the image's Python (standard library only, Python 3.8+):
``python -c <this file> SOCKET PORT``.  The container has no network but ``lo``; HTTP
clients there are pointed at ``http://127.0.0.1:PORT`` and this forwards each
connection, byte for byte, to the proxy on the host, which decides.  The relay decides
nothing: it is the sandbox's own process and trusted by no one.

The process binds first and then detaches (so the host's exec returns once the port
is ready); if the port is taken — the relay already runs after an in-place kernel
restart — it exits at once with status 0.
"""

from __future__ import annotations  # annotations stay unevaluated (Python 3.8)

import contextlib
import os
import socket
import sys
import threading

_CHUNK = 65536
#: Connections relayed at once (two threads each); the host proxy caps them at 32 too.
_MAX_CONNECTIONS = 32


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


def _serve(client: socket.socket, path: str, slots: threading.BoundedSemaphore) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
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


def main() -> None:
    path, port = sys.argv[1], int(sys.argv[2])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.bind(("127.0.0.1", port))
    except OSError:
        print("relay already listening on 127.0.0.1:{}".format(port))  # noqa: UP032 (3.8)
        return
    server.listen(64)
    child = os.fork()
    if child:
        print("relay listening on 127.0.0.1:{} as pid {}".format(port, child))  # noqa: UP032
        sys.stdout.flush()
        os._exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
    while True:
        client, _ = server.accept()
        if not slots.acquire(blocking=False):
            client.close()
            continue
        try:
            threading.Thread(target=_serve, args=(client, path, slots), daemon=True).start()
        except RuntimeError:  # no thread left (pids_limit): drop this one, keep serving
            client.close()
            slots.release()


if __name__ == "__main__":
    main()
