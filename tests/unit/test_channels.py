"""The host's channels (kernel/channels.py) read through the event loop, against real ZMQ
sockets standing in for a kernel: a message queued before a wait is read at once (ZMQ's
FD only says something may have changed, and a read or send clears it), one arriving
during a wait wakes it, several readers may wait at once, a channel moves to another event
loop, closing wakes its readers, and a message not signed with the session's key is
dropped."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
import zmq
from jupyter_client.session import Session

from kernel_sandbox.kernel.client import KernelSession
from kernel_sandbox.kernel.connection import ConnectionInfo, new_connection_info
from tests.waiting import await_for, wait_for


class Kernel:
    """ROUTER shell and control, PUB iopub, bound where ``info`` says; replies signed
    with ``info``'s key (or another one)."""

    def __init__(self, tmp_path: Path) -> None:
        self.info: ConnectionInfo = new_connection_info("ipc", f"{tmp_path}/k")
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.session = Session(key=self.info["key"].encode())
        self.sockets = {}
        for name, kind in (("shell", zmq.ROUTER), ("iopub", zmq.PUB), ("control", zmq.ROUTER)):
            sock = self.context.socket(kind)
            sock.linger = 0
            sock.bind(f"ipc://{self.info['ip']}-{self.info[f'{name}_port']}")  # type: ignore[literal-required]
            self.sockets[name] = sock
        self.request: tuple[list[bytes], dict[str, Any]] | None = None

    def take_request(self) -> dict[str, Any]:
        """The next request on shell (kept to reply to)."""
        assert self.sockets["shell"].poll(10_000), "no request reached the kernel"
        idents, msg = self.session.feed_identities(self.sockets["shell"].recv_multipart())
        self.request = idents, self.session.deserialize(msg)
        return self.request[1]

    def reply(self, n: int = 1, session: Session | None = None) -> None:
        """``n`` replies to the request taken last."""
        assert self.request is not None
        idents, parent = self.request
        for _ in range(n):
            (session or self.session).send(
                self.sockets["shell"], "kernel_info_reply", {}, parent=parent, ident=idents
            )

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(tmp_path)
    yield k
    k.close()


@pytest.fixture
def session(kernel: Kernel) -> Iterator[KernelSession]:
    s = KernelSession(kernel.info)
    s.channels.start()
    yield s
    s.close()


async def _next(session: KernelSession, timeout: float = 30) -> dict[str, Any]:
    while (msg := await session._get_msg("shell", timeout)) is None:
        pass
    return msg


async def test_a_message_queued_before_a_wait_is_read_without_waiting(
    kernel: Kernel, session: KernelSession
) -> None:
    msg_id = session._request("kernel_info_request")
    assert kernel.take_request()["header"]["msg_id"] == msg_id
    kernel.reply(2)
    first = await _next(session)
    # once the second is queued, asking ZMQ_EVENTS (as reading the first did) clears the
    # FD: a wait on the FD alone would not end before its timeout (a minute)
    await await_for(session.channels.open["shell"].readable, what="the second reply")
    second = await asyncio.wait_for(session._get_msg("shell", 60), 10)
    assert second is not None
    assert first["parent_header"]["msg_id"] == second["parent_header"]["msg_id"] == msg_id
    with pytest.raises(Empty):
        await session._get_msg("shell", 0)


async def test_a_message_arriving_during_a_wait_wakes_it(
    kernel: Kernel, session: KernelSession
) -> None:
    msg_id = session._request("kernel_info_request")
    kernel.take_request()
    shell = session.channels.open["shell"]
    # a minute: a wait not woken by the FD would still end with the message, much later
    reader = asyncio.create_task(_next(session, 60))
    await await_for(lambda: shell._waiters, what="the reader waiting on the FD")
    kernel.reply()
    reply = await asyncio.wait_for(reader, 10)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["msg_type"] == "kernel_info_reply"


async def test_several_readers_wait_at_once(kernel: Kernel, session: KernelSession) -> None:
    session._request("kernel_info_request")
    kernel.take_request()
    shell = session.channels.open["shell"]
    readers = [asyncio.create_task(_next(session, 60)) for _ in range(2)]
    await await_for(lambda: len(shell._waiters) == 2, what="both readers waiting")
    kernel.reply(2)
    replies = await asyncio.wait_for(asyncio.gather(*readers), 10)
    assert [r["msg_type"] for r in replies] == ["kernel_info_reply"] * 2
    assert replies[0]["header"]["msg_id"] != replies[1]["header"]["msg_id"]


async def test_closing_a_channel_wakes_its_readers(kernel: Kernel, session: KernelSession) -> None:
    shell = session.channels.open["shell"]
    reader = asyncio.create_task(session._get_msg("shell", 60))
    await await_for(lambda: shell._waiters, what="the reader waiting on the FD")
    session.channels.close_channel("shell")
    with pytest.raises(Empty):
        await asyncio.wait_for(reader, 10)


async def test_a_message_not_signed_with_the_key_is_dropped(
    kernel: Kernel, session: KernelSession
) -> None:
    session._request("kernel_info_request")
    kernel.take_request()
    kernel.reply(session=Session(key=b"not the kernel's key"))
    kernel.reply()
    assert await session._get_msg("shell", 30) is None  # the forged one
    assert (await _next(session))["msg_type"] == "kernel_info_reply"


def test_a_channel_moves_to_another_event_loop(kernel: Kernel, session: KernelSession) -> None:
    """Read from a loop in another thread that keeps running, then from this thread's:
    the first loop stops watching the socket (in its own thread), the second reads."""

    async def round_trip() -> bool:
        msg_id = session._request("kernel_info_request")
        reader = asyncio.create_task(_next(session, 60))
        shell = session.channels.open["shell"]
        await await_for(lambda: shell._waiters, what="the reader waiting on the FD")
        kernel.take_request()
        kernel.reply()
        reply = await asyncio.wait_for(reader, 10)
        return bool(reply["parent_header"]["msg_id"] == msg_id)

    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        assert asyncio.run_coroutine_threadsafe(round_trip(), other).result(30)
        fd = session.channels.open["shell"]._fd
        assert fd in other._selector.get_map()  # type: ignore[attr-defined]
        assert asyncio.run(round_trip())
        wait_for(
            lambda: fd not in other._selector.get_map(),  # type: ignore[attr-defined]
            what="the first loop to stop watching the socket",
        )
        assert asyncio.run(round_trip())  # and again from a third loop (the second closed)
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()
