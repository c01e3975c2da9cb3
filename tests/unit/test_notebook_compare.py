"""Normalising and comparing outputs: what must match, what may change between runs.

Every rule comes in pairs: noise re-run must pass, a changed value must be caught.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernel_sandbox.notebook import Tolerance, compare_outputs, normalise_outputs, normalise_text


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
        (
            "CPU times: user 3 ms, sys: 0 ns, total: 3 ms",
            "CPU times: user 1.1 s, sys: 2 ms, total: 1.1 s",
        ),
        ("took 0.25s", "took 3s"),
        ("fit finished in 2.5 seconds", "fit finished in 19 seconds"),
        ("id 4b0a1c2e-1111-4222-8333-123456789abc", "id 00000000-aaaa-4bbb-8ccc-ddddeeeeffff"),
        ("\x1b[31mred\x1b[0m  \n", "red"),
        ("/tmp/ipykernel_42/1234.py:3: UserWarning", "/tmp/ipykernel_7/999.py:3: UserWarning"),
        # %timeit: IPython 9 prints the Greek mu, older versions the micro sign; loops vary
        (
            "10.2 μs ± 0.3 μs per loop (mean ± std. dev. of 7 runs, 100,000 loops each)",
            "9.87 µs ± 12.1 ns per loop (mean ± std. dev. of 7 runs, 10000 loops each)",
        ),
        ("1000 loops, best of 3: 1.5 ms per loop", "100 loops, best of 5: 2.1 ms per loop"),
        (
            "The slowest run took 5.03 times longer than the fastest. This could mean that an "
            "intermediate result is being cached.\n1 µs ± 0 ns per loop (mean ± std. dev. of 7 "
            "runs, 1 loop each)",
            "2 µs ± 1 ns per loop (mean ± std. dev. of 7 runs, 1 loop each)",
        ),
        (
            "100%|██████████| 10/10 [00:01<00:00,  9.52it/s]",
            "100%|██████████| 10/10 [00:03<00:00,  3.10it/s]",
        ),
        (
            "<DisplayHandle display_id=118a56127f42348f8893440da7181c57>",
            "<DisplayHandle display_id=15d3c621bac5e624771196f17ddac953>",
        ),
    ],
)
def test_volatile_text_is_normalised(a: str, b: str) -> None:
    assert normalise_text(a) == normalise_text(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("x = 41", "x = 42"),
        ("2024-05-01", "2024-05-02"),
        ("3 items", "4 items"),
        ("0x1f", "0x2f"),  # hex literals are values, not addresses
        ("value 0x7f3a2b1c4d90", "value 0x7f99aa00bb11"),  # no "at": not a repr's address
        # timestamps and epoch seconds are data: a clock is tagged nondeterministic instead
        ("Timestamp('2015-07-04 00:00:00')", "Timestamp('2099-12-31 23:59:59')"),
        ("at 2024-05-01T10:11:12.345678", "at 2025-01-02 03:04:05"),
        ("1500000000", "1999999999"),
        ("t=1712345678.12", "t=1799999999.5"),
        # a duration never swallows a number on the line before (Series.describe())
        ("std 1.58\nmin 0.10", "std 9.99\nmin 0.10"),
        ("mean 3.5\nstd 1.58\nmin 1.0\n25% 2.0", "mean 3.5\nstd 9.99\nmin 1.0\n25% 2.0"),
        # units without a timing word on the line are physics, not a clock
        ("falls 4.9 m in 1.0 s", "falls 4.9 m in 2.0 s"),
        # only random (version 4) UUIDs are neutralised; name-based ones are data
        ("886313e1-3b8a-5372-9b90-0c9aee199e5d", "886313e1-3b8a-5372-9b90-0c9aee199e5e"),
        ("10.2 µs ± 0.3 µs per loop", "10.2 µs ± 0.3 µs per loop, then 4"),
    ],
)
def test_real_differences_survive_normalisation(a: str, b: str) -> None:
    assert not compare_outputs([stream(a)], [stream(b)]).same
    assert compare_outputs([stream(a)], [stream(a)]).same  # the same output re-run passes


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("0.30000000000000004", "0.3", True),
        ("loss 0.6931471805599453", "loss 0.6931471805599454", True),
        ("loss 0.6931471805599453", "loss 0.6932", False),
        ("1.0", "1", True),  # another print format, the same value
        ("1500000000", "1500000001", False),  # integers are exact
        ("[1.5e-10, 2]", "[1.5000000000000002e-10, 2]", True),
        ("x1 = 2.5", "x2 = 2.5", False),  # digits inside names are not numbers
        ("-0.5", "0.5", False),
    ],
)
def test_numbers_match_within_the_relative_tolerance(a: str, b: str, same: bool) -> None:
    assert compare_outputs([stream(a)], [stream(b)]).same is same


def test_relative_tolerance_is_configurable() -> None:
    loose = Tolerance(rel_tol=1e-3)
    assert compare_outputs([stream("0.6931")], [stream("0.6932")], tolerance=loose).same
    assert not compare_outputs([stream("0.6931")], [stream("0.6932")]).same


def test_identical_outputs_with_new_counts_and_metadata_are_same() -> None:
    recorded = [stream("hi\n"), result({"text/plain": "42"}, count=3)]
    replayed = [stream("hi\n"), result({"text/plain": "42"}, count=1)]
    replayed[1]["metadata"] = {"something": True}
    assert compare_outputs(recorded, replayed).verdict == "same"


def test_stream_chunks_and_interleaving_do_not_matter() -> None:
    recorded = [stream("a\n"), stream("warn\n", "stderr"), stream("b\n")]
    replayed = [stream("a\nb\n"), stream("warn\n", "stderr")]
    assert compare_outputs(recorded, replayed).same


def test_html_tables_compare_as_their_text() -> None:
    old = "<style scoped>.df {color: red}</style><table><tr><th>a</th><td>1.50</td></tr></table>"
    new = "<div><style>.x{}</style><table class='n'><tr><th>a</th><td>1.5</td></tr></table></div>"
    changed = "<table><tr><th>a</th><td>2.50</td></tr></table>"
    assert compare_outputs([result({"text/html": old})], [result({"text/html": new})]).same
    comparison = compare_outputs([result({"text/html": old})], [result({"text/html": changed})])
    assert comparison.verdict == "differs"
    assert "-[execute_result text/html] a\t1.50" in comparison.diff
    assert "+[execute_result text/html] a\t2.50" in comparison.diff


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
