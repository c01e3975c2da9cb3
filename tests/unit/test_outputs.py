"""OutputCollector turns canned iopub messages into the outputs Jupyter would show."""

from __future__ import annotations

import copy
from typing import Any

from kernel_sandbox.kernel.outputs import OutputCollector


def msg(msg_type: str, **content: Any) -> dict[str, Any]:
    return {"header": {"msg_type": msg_type}, "parent_header": {}, "content": content}


def stream(name: str, text: str) -> dict[str, Any]:
    return msg("stream", name=name, text=text)


def display(data: dict[str, Any], display_id: str | None = None) -> dict[str, Any]:
    transient = {"display_id": display_id} if display_id else {}
    return msg("display_data", data=data, metadata={}, transient=transient)


def test_consecutive_chunks_of_one_stream_are_merged_in_order() -> None:
    c = OutputCollector()
    for m in (
        stream("stdout", "a\n"),
        stream("stdout", "b\n"),
        stream("stderr", "e\n"),
        stream("stdout", "c\n"),
    ):
        c.add(m)
    assert [(o["name"], o["text"]) for o in c.outputs] == [
        ("stdout", "a\nb\n"),
        ("stderr", "e\n"),
        ("stdout", "c\n"),
    ]


def test_carriage_return_overwrites_the_line_like_a_terminal() -> None:
    c = OutputCollector()
    c.add(stream("stdout", "10%\r"))
    c.add(stream("stdout", "50%\r100%\ndone\n"))
    assert c.outputs[0]["text"] == "100%\ndone\n"


def test_clear_output_now_and_with_wait() -> None:
    c = OutputCollector()
    c.add(stream("stdout", "old\n"))
    c.add(msg("clear_output", wait=False))
    assert c.outputs == []
    c.add(stream("stdout", "kept until next\n"))
    c.add(msg("clear_output", wait=True))
    assert len(c.outputs) == 1  # wait=True clears only when the next output arrives
    c.add(stream("stdout", "new\n"))
    assert [o["text"] for o in c.outputs] == ["new\n"]


def test_update_display_data_replaces_the_display_in_place() -> None:
    c = OutputCollector()
    c.add(display({"text/plain": "v1"}, "d1"))
    c.add(stream("stdout", "between\n"))
    shown = c.add(
        msg(
            "update_display_data",
            data={"text/plain": "v2"},
            metadata={},
            transient={"display_id": "d1"},
        )
    )
    assert shown is not None and shown["data"] == {"text/plain": "v2"}
    assert c.outputs[0]["data"] == {"text/plain": "v2"}
    assert len(c.outputs) == 2


def test_result_and_error_outputs_are_nbformat_dicts() -> None:
    c = OutputCollector()
    c.add(msg("execute_result", data={"text/plain": "42"}, metadata={}, execution_count=3))
    c.add(msg("error", ename="ValueError", evalue="bad", traceback=["tb"]))
    assert c.outputs[0] == {
        "output_type": "execute_result",
        "data": {"text/plain": "42"},
        "metadata": {},
        "execution_count": 3,
    }
    assert c.outputs[1]["output_type"] == "error" and c.outputs[1]["ename"] == "ValueError"


def test_non_output_messages_are_ignored() -> None:
    c = OutputCollector()
    assert c.add(msg("execute_input", code="1", execution_count=1)) is None
    assert c.outputs == []


def test_outputs_equal_what_nbformat_builds_and_validate() -> None:
    import nbformat
    from nbformat.v4 import output_from_msg

    messages = [
        stream("stdout", "x\n"),
        display({"image/png": "iVBOR", "text/plain": "<Figure>"}),
        msg("execute_result", data={"text/plain": "1"}, metadata={}, execution_count=1),
        msg("error", ename="E", evalue="v", traceback=["t"]),
    ]
    for m in messages:
        c = OutputCollector()
        ours = c.add(m)
        assert ours == dict(output_from_msg(m))
        nbformat.validator.validate(ours, ours["output_type"], version=4)


# -- the output cap -------------------------------------------------------------------


def stdout_of(outputs: list[dict[str, Any]]) -> str:
    return "".join(o["text"] for o in outputs if o.get("name") == "stdout")


def test_capped_stream_keeps_head_and_tail_and_counts_what_was_dropped() -> None:
    c = OutputCollector(max_bytes=1000)
    lines = [f"line {i:04d}\n" for i in range(1000)]  # 10 bytes each, 10,000 in all
    for line in lines:
        c.add(stream("stdout", line))
    text = stdout_of(c.outputs)
    assert text.startswith("".join(lines[:50]))  # the first 500 bytes
    assert text.endswith("".join(lines[-50:]))  # the last 500 bytes
    assert c.truncated_bytes == 10_000 - 1000
    assert "[... output capped: 9,000 bytes (900 lines) dropped here;" in text
    kept = text.replace(c.outputs[1]["text"], "")
    assert len(kept.encode()) == 1000


def test_text_past_half_the_cap_but_within_it_is_kept_whole() -> None:
    c = OutputCollector(max_bytes=100)
    for _ in range(9):
        c.add(stream("stdout", "z" * 10))
    assert c.outputs == [{"output_type": "stream", "name": "stdout", "text": "z" * 90}]
    assert c.truncated_bytes == 0


def test_one_huge_chunk_is_cut_too() -> None:
    c = OutputCollector(max_bytes=100)
    c.add(stream("stdout", "H" * 50 + "x" * 10**6 + "T" * 50))
    outputs = c.outputs
    assert [o["text"] for o in outputs if "capped" not in o["text"]] == ["H" * 50, "T" * 50]
    assert c.truncated_bytes == 10**6


def test_a_listener_gets_one_notice_at_the_cut_and_no_text_after_it() -> None:
    c = OutputCollector(max_bytes=100)
    shown = [c.add(stream("stdout", "y" * 30 + "\n")) for _ in range(10)]
    assert all(s is not None for s in shown[:1])
    notices = [s for s in shown if s is not None and "not shown live" in s["text"]]
    assert len(notices) == 1
    assert shown[shown.index(notices[0]) + 1 :] == [None] * (9 - shown.index(notices[0]))


def test_stdout_and_stderr_share_the_budget_and_keep_their_order() -> None:
    c = OutputCollector(max_bytes=40)
    c.add(stream("stdout", "a" * 10))
    c.add(stream("stderr", "E" * 10))
    for _ in range(20):
        c.add(stream("stdout", "b" * 10))
    c.add(stream("stderr", "last error\n"))
    names = [o["name"] for o in c.outputs]
    assert names[:2] == ["stdout", "stderr"] and names[-1] == "stderr"
    assert c.outputs[-1]["text"] == "last error\n"


def test_multibyte_text_is_never_cut_inside_a_character() -> None:
    c = OutputCollector(max_bytes=101)
    for _ in range(100):
        c.add(stream("stdout", "é€😀"))  # 2 + 3 + 4 bytes
    kept = [o["text"] for o in c.outputs if "capped" not in o["text"]]
    assert all(t.encode().decode() == t for t in kept)
    assert sum(len(t.encode()) for t in kept) <= 101
    assert sum(len(t.encode()) for t in kept) + c.truncated_bytes == 900


def test_rich_outputs_over_the_cap_become_one_placeholder() -> None:
    c = OutputCollector(max_bytes=1000)
    shown = [c.add(display({"image/png": "A" * 400})) for _ in range(10)]
    kept = [o for o in c.outputs if "image/png" in o["data"]]
    assert len(kept) == 2 and c.truncated_bytes == 8 * 400
    placeholders = [o for o in c.outputs if "image/png" not in o["data"]]
    assert len(placeholders) == 1
    assert "8 rich output(s)" in placeholders[0]["data"]["text/plain"]
    assert sum(s is not None for s in shown) == 3  # two images and the placeholder once


def test_rich_output_between_dropped_text_is_kept_before_the_marker() -> None:
    c = OutputCollector(max_bytes=100)
    c.add(stream("stdout", "h" * 60))
    c.add(display({"text/plain": "figure"}))
    c.add(stream("stdout", "m" * 500))
    c.add(stream("stdout", "t" * 50))
    kinds = [o["output_type"] for o in c.outputs]
    assert kinds == ["stream", "display_data", "stream", "stream"]
    assert c.outputs[-1]["text"] == "t" * 50
    assert c.outputs[0]["text"] == "h" * 50


def test_clear_output_empties_a_capped_collector_too() -> None:
    c = OutputCollector(max_bytes=20)
    c.add(stream("stdout", "x" * 100))
    c.add(msg("clear_output", wait=False))
    c.add(stream("stdout", "fresh\n"))
    assert c.outputs == [{"output_type": "stream", "name": "stdout", "text": "fresh\n"}]
    assert c.truncated_bytes == 0


def test_an_update_that_would_pass_the_cap_is_dropped_and_counted() -> None:
    c = OutputCollector(max_bytes=100)
    c.add(display({"text/plain": "v1"}, "d1"))
    update = msg(
        "update_display_data",
        data={"text/plain": "v" * 200},
        metadata={},
        transient={"display_id": "d1"},
    )
    c.add(update)
    assert c.outputs[0]["data"] == {"text/plain": "v1"}
    assert c.truncated_bytes == 200


def test_capped_outputs_are_a_valid_notebook_cell() -> None:
    import nbformat

    from kernel_sandbox.notebook.cells import python_cell
    from kernel_sandbox.results import Execution

    c = OutputCollector(max_bytes=100)
    for _ in range(50):
        c.add(stream("stdout", "x" * 9 + "\n"))
        c.add(display({"image/png": "QUJD" * 10}))
    c.add(msg("error", ename="E", evalue="v", traceback=["t"]))
    ex = Execution("error", c.outputs, 1, truncated_bytes=c.truncated_bytes)
    nb = nbformat.v4.new_notebook(cells=[python_cell("loop()", ex)])
    nbformat.validate(nb)
    assert nb.cells[0].metadata["kernel_sandbox"]["truncated_bytes"] == c.truncated_bytes


def update(data: dict[str, Any], display_id: str) -> dict[str, Any]:
    return msg("update_display_data", data=data, metadata={}, transient={"display_id": display_id})


DISPLAY_SEQUENCES = {
    "second display with the same id": [
        display({"text/plain": "a"}, "x"),
        stream("stdout", "between\n"),
        display({"text/plain": "b"}, "x"),
    ],
    "update, then a new display": [
        display({"text/plain": "a"}, "x"),
        update({"text/plain": "b"}, "x"),
        display({"text/plain": "c"}, "y"),
        update({"text/plain": "d"}, "unknown"),
    ],
    "update after clear_output(wait=True) does not clear": [
        display({"text/plain": "a"}, "x"),
        msg("clear_output", wait=True),
        update({"text/plain": "b"}, "x"),
        stream("stdout", "now it clears\n"),
        display({"text/plain": "c"}, "x"),
    ],
    "display after clear_output updates the cleared one's id too": [
        display({"text/plain": "a"}, "x"),
        msg("clear_output", wait=False),
        display({"text/plain": "b"}, "x"),
        update({"text/plain": "c"}, "x"),
    ],
}


def test_display_ids_within_a_request_behave_exactly_as_nbclient() -> None:
    """nbclient's NotebookClient.process_message is the reference, message for message."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    for name, messages in DISPLAY_SEQUENCES.items():
        cell = new_code_cell("")
        client = NotebookClient(new_notebook(cells=[cell]))
        client.reset_execution_trackers()
        client.clear_before_next_output = False
        collector = OutputCollector()
        for message in messages:
            collector.add(copy.deepcopy(message))
            # nbclient rewrites an update's header in place: give it its own copy
            reference = copy.deepcopy(message)
            client.process_message(
                {**reference, "msg_type": reference["header"]["msg_type"]}, cell, 0
            )
        assert collector.outputs == [dict(o) for o in cell.outputs], name


def test_updates_for_earlier_requests_and_display_positions_are_kept() -> None:
    c = OutputCollector()
    c.add(stream("stdout", "x\n"))
    c.add(display({"text/plain": "mine"}, "here"))
    c.add(update({"text/plain": "theirs v1"}, "earlier"))
    c.add(update({"text/plain": "theirs v2"}, "earlier"))
    assert c.display_ids(c.outputs) == {"here": [1]}
    assert c.display_updates == {
        "here": ({"text/plain": "mine"}, {}),
        "earlier": ({"text/plain": "theirs v2"}, {}),
    }


def test_updates_kept_for_earlier_requests_are_bounded() -> None:
    c = OutputCollector(max_bytes=1000)
    for i in range(50):
        c.add(update({"text/plain": "x" * 100}, f"id{i}"))
    assert sum(len(d["text/plain"]) for d, _ in c.display_updates.values()) <= 1000


def error_size(output: dict[str, Any]) -> int:
    return len(output["ename"]) + len(output["evalue"]) + sum(map(len, output["traceback"]))


def test_errors_count_against_the_cap() -> None:
    """Many large errors keep at most ``max_bytes`` of error text; the rest is counted."""
    c = OutputCollector(max_bytes=64 * 1024)
    for _ in range(50):
        c.add(msg("error", ename="E", evalue="v" * 20_000, traceback=["t" * 20_000]))
    errors = [o for o in c.outputs if o["output_type"] == "error"]
    assert errors and sum(map(error_size, errors)) <= 64 * 1024
    assert c.truncated_bytes >= 50 * 40_000 - 64 * 1024
    placeholders = [o for o in c.outputs if o["output_type"] == "display_data"]
    assert len(placeholders) == 1 and "rich output(s)" in placeholders[0]["data"]["text/plain"]


def test_one_huge_error_keeps_its_ends_and_last_traceback_lines() -> None:
    c = OutputCollector(max_bytes=10_000)
    tb = [f"frame {i}\n" for i in range(10_000)] + ["ValueError: the raising line"]
    c.add(msg("error", ename="ValueError", evalue="<" + "m" * 1_000_000 + ">", traceback=tb))
    (error,) = c.outputs
    assert error_size(error) <= 10_000
    assert error["ename"] == "ValueError"
    assert error["evalue"].startswith("<m") and error["evalue"].endswith("m>")
    assert error["traceback"][-1] == "ValueError: the raising line"
    assert "capped" in error["traceback"][0]
    assert c.truncated_bytes > 1_000_000


MALFORMED = [
    msg("display_data", data=["a", "list"], metadata={}),
    msg("display_data", data={"text/plain": 5}),
    msg("display_data", data={"text/plain": "x"}, metadata=[]),
    msg("display_data", data={"text/plain": "x"}, transient={"display_id": 7}),
    msg("update_display_data", data=None, transient={"display_id": "d"}),
    msg("execute_result", data={"text/plain": "x"}, execution_count="1"),
    msg("stream", name="stdout", text=None),
    msg("stream", name="weird", text="x"),
    msg("error", ename="E", evalue="v", traceback=5),
    {"header": {"msg_type": "display_data"}, "parent_header": {}, "content": ["not", "a", "dict"]},
]


def test_malformed_outputs_become_a_note_and_one_rate_limited_warning(caplog) -> None:  # type: ignore[no-untyped-def]
    from kernel_sandbox.kernel import wellformed

    wellformed.MALFORMED_WARNINGS._next = 0.0  # a fresh window for this test
    c = OutputCollector()
    c.add(display({"text/plain": "fine"}))
    with caplog.at_level("WARNING", logger="kernel_sandbox.kernel"):
        for m in MALFORMED * 50:
            c.add(m)
    outputs = c.outputs
    assert outputs[0]["data"] == {"text/plain": "fine"}
    notes = "".join(o["text"] for o in outputs if o.get("name") == "stderr")
    assert notes.count("dropped a malformed") == len(MALFORMED) * 50
    warnings = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 1 and not any(r.exc_info for r in caplog.records)
    assert len(warnings[0].getMessage()) <= 300


def test_a_flood_of_malformed_outputs_keeps_within_the_output_cap() -> None:
    c = OutputCollector(max_bytes=4096)
    for _ in range(10_000):
        c.add(MALFORMED[0])
    assert sum(len(o.get("text", "")) for o in c.outputs) <= 4096 + 512
