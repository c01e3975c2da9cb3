"""ToolResult: small JSON for the model, full data for Python callers."""

from __future__ import annotations

import base64
import json

from kernel_sandbox.tools.results import ToolResult, render_outputs, truncate_middle

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 100  # 25.6 KB of "image"
PNG_B64 = base64.b64encode(PNG).decode()


def figure_outputs() -> list[dict[str, object]]:
    return [
        {"output_type": "stream", "name": "stdout", "text": "plotting\n"},
        {
            "output_type": "display_data",
            "data": {"image/png": PNG_B64, "text/plain": "<Figure size 640x480 with 1 Axes>"},
            "metadata": {},
        },
        {
            "output_type": "execute_result",
            "execution_count": 3,
            "data": {"image/jpeg": PNG_B64, "text/plain": "<Image>"},
            "metadata": {},
        },
    ]


def result_with_images() -> ToolResult:
    text, artifacts = render_outputs(figure_outputs())
    return ToolResult(
        status="success",
        tool_name="python_executor",
        output=text,
        artifacts=artifacts,
        outputs=figure_outputs(),
    )


def test_images_become_numbered_placeholders_in_the_text() -> None:
    text, artifacts = render_outputs(figure_outputs())
    assert text.splitlines() == [
        "plotting",
        "[image/png #1, 25.0 KB] <Figure size 640x480 with 1 Axes>",
        "[image/jpeg #2, 25.0 KB] <Image>",
    ]
    assert [(a.name, a.mime_type, a.size) for a in artifacts] == [
        ("image/png #1", "image/png", len(PNG)),
        ("image/jpeg #2", "image/jpeg", len(PNG)),
    ]


def test_json_for_the_model_has_no_base64_and_stays_small() -> None:
    dumped = result_with_images().model_dump_json()
    assert PNG_B64[:40] not in dumped
    assert len(dumped) < 1000
    data = json.loads(dumped)
    assert set(data) == {
        "status",
        "tool_name",
        "output",
        "error",
        "execution_time",
        "metadata",
        "artifacts",
    }
    assert data["artifacts"][0] == {
        "name": "image/png #1",
        "mime_type": "image/png",
        "size": len(PNG),
    }


def test_python_callers_still_get_the_image_bytes() -> None:
    result = result_with_images()
    assert result.images() == [PNG]
    assert result.images("image/jpeg") == [PNG]
    assert result.artifact_bytes("image/jpeg #2") == PNG


def test_vision_content_carries_images_as_data_url_parts() -> None:
    result = result_with_images()
    parts = result.to_message_content(vision=True)
    assert isinstance(parts, list)
    assert parts[0]["type"] == "text"
    assert json.loads(parts[0]["text"])["artifacts"][0]["name"] == "image/png #1"
    urls = [p["image_url"]["url"] for p in parts[1:]]
    assert urls == [f"data:image/png;base64,{PNG_B64}", f"data:image/jpeg;base64,{PNG_B64}"]


def test_without_vision_the_content_is_the_compact_json() -> None:
    result = result_with_images()
    assert result.to_message_content() == result.model_dump_json()
    message = result.to_tool_message("call_9")
    assert message["role"] == "tool"
    assert message["tool_call_id"] == "call_9"
    assert message["content"] == result.model_dump_json()


def test_a_pdf_stays_a_placeholder_even_for_vision_models() -> None:
    outputs = [
        {"output_type": "display_data", "data": {"application/pdf": PNG_B64}, "metadata": {}}
    ]
    text, artifacts = render_outputs(outputs)
    assert text == "[application/pdf #1, 25.0 KB]"
    result = ToolResult(
        status="success", tool_name="t", output=text, artifacts=artifacts, outputs=outputs
    )
    assert result.image_parts() == []


def test_truncation_keeps_head_and_tail_and_says_how_much_is_missing() -> None:
    lines = [f"line {i}" for i in range(10_000)]
    text = "\n".join(lines)
    cut, omitted = truncate_middle(text, 1000)
    assert len(cut) < 1100
    assert cut.startswith("line 0\nline 1\n")
    assert cut.endswith("line 9999")
    assert omitted > 0
    assert f"[... {omitted:,} characters" in cut
    # the pieces shown plus the omitted count add up to the original
    head, _, tail = cut.partition("\n[...")
    tail = tail.split("omitted ...]\n", 1)[1]
    assert len(head) + 1 + omitted + len(tail) == len(text)


def test_short_text_is_left_alone() -> None:
    assert truncate_middle("abc", 10) == ("abc", 0)


def test_failure_results_say_what_went_wrong() -> None:
    result = ToolResult.failure("shell_executor", "no such directory", metadata={"exit_code": 126})
    assert not result.ok
    data = json.loads(result.model_dump_json())
    assert data["status"] == "error"
    assert data["error"] == "no such directory"
    assert data["metadata"] == {"exit_code": 126}


def test_full_output_is_bounded_by_the_sandboxs_output_cap() -> None:
    from kernel_sandbox.tools.base import _fit_for_model

    result = ToolResult(status="success", tool_name="python_executor", output="x" * 100_000)
    fitted = _fit_for_model(result, limit=8_000, full_limit=20_000)
    assert len(fitted.output) <= 8_200 and fitted.metadata["output_truncated"]
    assert fitted.full_output is not None and len(fitted.full_output) <= 20_200
