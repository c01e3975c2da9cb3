"""The shared ZMQ context holds as many kernel connections as the process may open files.

ZMQ's default socket table (1023) stopped one process at 255 sandboxes with
``ZMQError: Too many open files`` while its file-descriptor limit was 20 000.
"""

from __future__ import annotations

import resource

import pytest
import zmq

from kernel_sandbox.kernel import channels


@pytest.fixture
def fresh_context(monkeypatch: pytest.MonkeyPatch):
    """A new shared context made by the library (the process's own one is left alone)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    monkeypatch.setattr(channels, "_CONTEXT", None)
    ctx = channels.shared_context()
    yield ctx
    ctx.destroy(linger=0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_context_holds_more_sockets_than_zmq_default(fresh_context: zmq.Context) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= 1500, "this machine's hard open-file limit is too low for the test"
    assert fresh_context.get(zmq.MAX_SOCKETS) >= 1500
    sockets = []
    try:
        for _ in range(1100):  # more than 255 sandboxes hold (three or four channels each)
            sockets.append(fresh_context.socket(zmq.DEALER))
    finally:
        for s in sockets:
            s.close(linger=0)
    assert len(sockets) == 1100


def test_max_sockets_follows_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (20_000, 20_000))
    assert channels.max_sockets() == 20_000
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 1024))
    assert channels.max_sockets() == 1023  # never below ZMQ's own default
    inf = resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda _: (inf, inf))
    assert channels.max_sockets() == channels.MAX_SOCKETS_CAP
