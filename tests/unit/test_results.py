"""Execution's compact text view: what a model or a terminal sees."""

from __future__ import annotations

import base64

from kernel_sandbox.results import Execution, ExecutionError, output_text

PNG = base64.b64encode(b"\x89PNG" + b"\0" * 5000).decode()


def test_text_names_images_instead_of_dumping_them() -> None:
    ex = Execution(
        "ok",
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "hello\n"},
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
            },
        ],
    )
    assert ex.text.startswith("hello\n<image/png, 4.9 KB>")
    assert "Figure size 640x480" in ex.text
    assert PNG[:40] not in ex.text
    assert ex.images() == [base64.b64decode(PNG)]


def test_error_text_has_no_colour_codes_and_message_is_appended() -> None:
    ex = Execution(
        "timeout",
        outputs=[
            {
                "output_type": "error",
                "ename": "KeyboardInterrupt",
                "evalue": "",
                "traceback": ["\x1b[0;31mKeyboardInterrupt\x1b[0m"],
            }
        ],
        error=ExecutionError("KeyboardInterrupt", ""),
        message="execution timed out after 1s",
    )
    assert ex.text == "KeyboardInterrupt\n[execution timed out after 1s]"
    assert ex.error is not None and ex.error.summary == "KeyboardInterrupt"


def test_html_only_output_falls_back_to_its_mime_name() -> None:
    assert (
        output_text(
            {"output_type": "display_data", "data": {"text/html": "<b>x</b>"}, "metadata": {}}
        )
        == "<text/html>"
    )


def test_stdout_stderr_and_result_accessors() -> None:
    ex = Execution(
        "ok",
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "o"},
            {"output_type": "stream", "name": "stderr", "text": "e"},
            {
                "output_type": "execute_result",
                "data": {"text/plain": "1"},
                "metadata": {},
                "execution_count": 1,
            },
        ],
    )
    assert (ex.stdout, ex.stderr, ex.result["data"]["text/plain"]) == ("o", "e", "1")  # type: ignore[index]
