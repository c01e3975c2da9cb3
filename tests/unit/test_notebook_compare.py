"""Normalising and comparing outputs: what must match, what may change between runs."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from kernel_sandbox.notebook import compare_outputs, normalise_outputs, normalise_text


def png(width: int, height: int, size: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return base64.b64encode(header + b"\0" * (size - len(header))).decode()


def stream(text: str, name: str = "stdout") -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": text}


def result(data: dict[str, Any], count: int = 1) -> dict[str, Any]:
    return {"output_type": "execute_result", "execution_count": count, "data": data, "metadata": {}}


def display(data: dict[str, Any]) -> dict[str, Any]:
    return {"output_type": "display_data", "data": data, "metadata": {}}


def error(ename: str, evalue: str, tb: list[str] | None = None) -> dict[str, Any]:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": tb or []}


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("<Foo object at 0x7f3a2b1c4d90>", "<Foo object at 0x7f99aa00bb11>"),
        ("Wall time: 1.52 ms", "Wall time: 310 µs"),
        ("took 0.25s", "took 3s"),
        ("at 2024-05-01T10:11:12.345678", "at 2025-01-02 03:04:05"),
        ("now 2024-05-01 10:11:12+00:00", "now 2024-05-02 01:01:01Z"),
        ("t=1712345678.12", "t=1799999999.5"),
        ("id 4b0a1c2e-1111-4222-8333-123456789abc", "id 00000000-aaaa-4bbb-8ccc-ddddeeeeffff"),
        ("\x1b[31mred\x1b[0m  \n", "red"),
        ("/tmp/ipykernel_42/1234.py:3: UserWarning", "/tmp/ipykernel_7/999.py:3: UserWarning"),
    ],
)
def test_volatile_text_is_normalised(a: str, b: str) -> None:
    assert normalise_text(a) == normalise_text(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("x = 41", "x = 42"),
        ("2024-05-01", "2024-05-02"),  # dates without a time are data, not clocks
        ("3 items", "4 items"),
        ("0x1f", "0x2f"),  # short hex literals are values, not addresses
    ],
)
def test_real_differences_survive_normalisation(a: str, b: str) -> None:
    assert normalise_text(a) != normalise_text(b)


def test_identical_outputs_with_new_counts_and_metadata_are_same() -> None:
    recorded = [stream("hi\n"), result({"text/plain": "42"}, count=3)]
    replayed = [stream("hi\n"), result({"text/plain": "42"}, count=1)]
    replayed[1]["metadata"] = {"something": True}
    assert compare_outputs(recorded, replayed).verdict == "same"


def test_stream_chunks_and_interleaving_do_not_matter() -> None:
    recorded = [stream("a\n"), stream("warn\n", "stderr"), stream("b\n")]
    replayed = [stream("a\nb\n"), stream("warn\n", "stderr")]
    assert compare_outputs(recorded, replayed).same


def test_images_match_by_type_pixels_and_size_ballpark() -> None:
    base = [display({"image/png": png(640, 480, 20_000), "text/plain": "<Figure>"})]
    similar = [display({"image/png": png(640, 480, 23_000), "text/plain": "<Figure>"})]
    other_size = [display({"image/png": png(800, 600, 20_000), "text/plain": "<Figure>"})]
    much_bigger = [display({"image/png": png(640, 480, 90_000), "text/plain": "<Figure>"})]
    no_image = [display({"text/plain": "<Figure>"})]
    assert compare_outputs(base, similar).same
    for changed in (other_size, much_bigger, no_image):
        assert compare_outputs(base, changed).verdict == "differs"
    assert "640x480" in compare_outputs(base, other_size).diff


def test_html_table_change_is_a_difference_with_a_short_diff() -> None:
    recorded = [result({"text/html": "<td>1</td>", "text/plain": "a 1"})]
    replayed = [result({"text/html": "<td>2</td>", "text/plain": "a 2"})]
    comparison = compare_outputs(recorded, replayed)
    assert comparison.verdict == "differs"
    assert "-[execute_result text/html] <td>1</td>" in comparison.diff
    assert "+[execute_result text/html] <td>2</td>" in comparison.diff


def test_new_error_is_named_and_tracebacks_are_ignored() -> None:
    recorded = [stream("0.5\n")]
    replayed = [error("NameError", "name 'x' is not defined", ["Cell In[7], line 1"])]
    comparison = compare_outputs(recorded, replayed)
    assert comparison.verdict == "new error"
    assert "NameError: name 'x' is not defined" in comparison.diff
    same_error = compare_outputs(
        [error("ZeroDivisionError", "division by zero", ["Cell In[2]"])],
        [error("ZeroDivisionError", "division by zero", ["Cell In[9]"])],
    )
    assert same_error.same


def test_changed_error_and_fixed_error_are_differences() -> None:
    assert (
        compare_outputs([error("KeyError", "'a'")], [error("KeyError", "'b'")]).verdict == "differs"
    )
    assert compare_outputs([error("KeyError", "'a'")], [stream("ok\n")]).verdict == "differs"


def test_long_diffs_are_cut() -> None:
    recorded = [stream("".join(f"line {i}\n" for i in range(100)))]
    replayed = [stream("".join(f"LINE {i}\n" for i in range(100)))]
    diff = compare_outputs(recorded, replayed, max_diff_lines=5).diff
    assert len(diff.splitlines()) == 6 and "more diff lines" in diff


def test_list_form_sources_from_disk_are_understood() -> None:
    # nbformat on disk may split strings into lists of lines.
    items = normalise_outputs([{"output_type": "stream", "name": "stdout", "text": ["a\n", "b"]}])
    assert [(i.kind, i.text) for i in items] == [("stdout", "a\nb")]
