"""OutputCollector turns canned iopub messages into the outputs Jupyter would show."""

from __future__ import annotations

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
