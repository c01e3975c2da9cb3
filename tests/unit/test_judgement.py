"""The verdict on a raw kernel reply: status, error, and the sentence a caller reads."""

from __future__ import annotations

from kernel_sandbox.judgement import error_of, judge
from kernel_sandbox.kernel.client import RawExecution

_ERROR = {
    "output_type": "error",
    "ename": "ZeroDivisionError",
    "evalue": "division by zero",
    "traceback": ["\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"],
}
_STREAM = {"output_type": "stream", "name": "stdout", "text": "hi\n"}


def test_a_finished_request_is_ok_with_its_count_and_duration() -> None:
    raw = RawExecution("finished", [_STREAM], {"status": "ok", "execution_count": 3})
    execution = judge(raw, timeout=10, duration=0.5)
    assert (execution.status, execution.execution_count, execution.duration) == ("ok", 3, 0.5)
    assert execution.outputs == [_STREAM]
    assert not execution.state_lost and execution.error is None


def test_an_error_output_makes_the_status_error_without_ansi_colours() -> None:
    raw = RawExecution("finished", [_STREAM, _ERROR], {"status": "error"})
    execution = judge(raw, timeout=10, duration=0.1)
    assert execution.status == "error"
    assert execution.error is not None
    assert execution.error.ename == "ZeroDivisionError"
    assert execution.error.traceback == ["ZeroDivisionError: division by zero"]


def test_an_error_only_in_the_reply_still_names_it() -> None:
    reply = {"status": "error", "ename": "Aborted", "evalue": "not run"}
    execution = judge(RawExecution("finished", [], reply), timeout=10, duration=0.1)
    assert execution.status == "error"
    assert execution.error is not None and execution.error.ename == "Aborted"


def test_an_interrupted_request_keeps_the_kernel_and_says_so() -> None:
    execution = judge(RawExecution("interrupted", [_STREAM]), timeout=2, duration=2.1)
    assert execution.status == "timeout" and not execution.state_lost
    assert "timed out after 2s and was interrupted" in execution.message


def test_stuck_and_dead_kernels_lose_state_and_say_why() -> None:
    stuck = judge(RawExecution("stuck"), timeout=2, duration=5)
    assert (stuck.status, stuck.state_lost) == ("timeout", True)
    assert "did not stop when interrupted" in stuck.message
    died = judge(RawExecution("died", death_reason="the kernel was killed"), 2, 0.3)
    assert (died.status, died.state_lost, died.message) == (
        "kernel_died",
        True,
        "the kernel was killed",
    )


def test_truncation_and_display_ids_are_carried_over() -> None:
    raw = RawExecution(
        "finished",
        [],
        {"status": "ok"},
        truncated_bytes=42,
        display_ids={"d1": [0]},
        display_updates={"d1": {"data": {}, "metadata": {}}},
    )
    execution = judge(raw, timeout=10, duration=0.1)
    assert execution.truncated_bytes == 42
    assert execution.display_ids == {"d1": [0]}
    assert execution.display_updates == {"d1": {"data": {}, "metadata": {}}}


def test_error_of_finds_the_last_error() -> None:
    other = {**_ERROR, "ename": "ValueError"}
    found = error_of([_ERROR, _STREAM, other])
    assert found is not None and found.ename == "ValueError"
    assert error_of([_STREAM]) is None
