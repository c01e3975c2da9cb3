"""HeadTail and the cap helpers: a byte stream kept within a budget, head and tail."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kernel_sandbox.limits import HeadTail, split_bytes, utf8_len
from kernel_sandbox.tools.results import capped_note


def test_short_output_is_kept_whole() -> None:
    buf = HeadTail(100)
    for chunk in (b"a" * 40, b"b" * 40, b"c" * 20):
        buf.add(chunk)
    assert buf.value() == b"a" * 40 + b"b" * 40 + b"c" * 20 and buf.dropped == 0


def test_long_output_keeps_head_and_tail_and_counts_bytes_and_lines() -> None:
    buf = HeadTail(100)
    data = b"".join(b"%09d\n" % i for i in range(1000))  # 10,000 bytes
    for start in range(0, len(data), 333):
        buf.add(data[start : start + 333])
    value = buf.value()
    assert value.startswith(data[:50]) and value.endswith(data[-50:])
    assert buf.dropped == 9900 and buf.dropped_lines == data[50:-50].count(b"\n")
    assert b"9,900 bytes (990 lines) dropped here" in value


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(min_value=1, max_value=500))
def test_kept_plus_dropped_is_everything_in_any_chunking(chunks: list[bytes], limit: int) -> None:
    buf = HeadTail(limit)
    for chunk in chunks:
        buf.add(chunk)
    data = b"".join(chunks)
    if buf.dropped == 0:
        assert buf.value() == data
    else:
        value = buf.value()
        assert value.startswith(data[: limit // 2])
        assert value.endswith(data[len(data) - (limit - limit // 2) :])
        assert buf.dropped == len(data) - limit


@given(st.text(max_size=200), st.integers(min_value=0, max_value=300))
def test_split_bytes_never_splits_a_character(text: str, size: int) -> None:
    head, rest = split_bytes(text, size)
    assert head + rest == text
    assert utf8_len(head) <= size


def test_capped_note_ends_the_text_only_when_output_was_dropped() -> None:
    assert capped_note("out", 0) == "out"
    note = capped_note("out", 3 * 1024**3)
    assert note.startswith("out\n") and "3.0 GB dropped" in note.splitlines()[-1]
