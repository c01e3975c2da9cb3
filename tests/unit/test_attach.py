"""The exec stream's frame reader: every byte the engine sent, in order, per stream."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel_sandbox.backends.docker.attach import STDERR, STDOUT, TruncatedStreamError, read_frames


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


class Trickle(io.RawIOBase):
    """A raw stream that hands out at most ``step`` bytes per read, like a slow socket."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._step = data, step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        size = min(len(buffer), self._step, len(self._data))
        buffer[:size], self._data = self._data[:size], self._data[size:]
        return size


def collect(body: io.BufferedIOBase) -> dict[int, bytes]:
    got: dict[int, bytes] = {STDOUT: b"", STDERR: b""}
    for stream, piece in read_frames(body):
        got[stream] += piece
    return got


def test_no_frames_is_empty_output() -> None:
    assert collect(io.BytesIO(b"")) == {STDOUT: b"", STDERR: b""}


def test_frames_already_buffered_with_the_headers_are_read() -> None:
    # what a late reader finds: the response headers and the whole output in one buffer
    raw = b"HTTP/1.1 101 UPGRADED\r\nUpgrade: tcp\r\n\r\n" + frame(STDOUT, b"tok\n")
    body = io.BufferedReader(io.BytesIO(raw))
    while body.readline() != b"\r\n":  # http.client reads the headers this way
        pass
    assert collect(body) == {STDOUT: b"tok\n", STDERR: b""}


def test_a_large_frame_streams_in_pieces() -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB in one frame
    pieces = list(read_frames(io.BytesIO(frame(STDOUT, payload))))
    assert len(pieces) > 1 and b"".join(p for _, p in pieces) == payload


@pytest.mark.parametrize("cut", [3, 8 + 2])
def test_a_stream_cut_inside_a_frame_is_an_error_not_a_short_output(cut: int) -> None:
    data = frame(STDOUT, b"done\n")[:cut]
    with pytest.raises(TruncatedStreamError):
        collect(io.BytesIO(data))


@given(
    st.lists(st.tuples(st.sampled_from([STDOUT, STDERR]), st.binary(max_size=200)), max_size=20),
    st.integers(min_value=1, max_value=13),
)
def test_any_frames_in_any_read_sizes_come_back_whole_per_stream(
    frames: list[tuple[int, bytes]], step: int
) -> None:
    body = io.BufferedReader(Trickle(b"".join(frame(s, p) for s, p in frames), step))
    assert collect(body) == {
        s: b"".join(p for fs, p in frames if fs == s) for s in (STDOUT, STDERR)
    }
