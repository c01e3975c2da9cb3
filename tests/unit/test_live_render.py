"""The live page shows sandbox and model output escaped: nothing of it runs in the page."""

from __future__ import annotations

from kernel_sandbox.limits import LIVE_PAGE_TEXT_CHARS as MAX_TEXT
from kernel_sandbox.server.live_render import render_cell


def test_markdown_and_text_are_escaped() -> None:
    md = render_cell({"cell_type": "markdown", "source": "hi <script>alert(1)</script>"}, 0)
    assert "<script>" not in md and "&lt;script&gt;" in md
    code = {
        "cell_type": "code",
        "source": "<img src=x onerror=alert(1)>",
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "<b>\x1b[31mred</b>"}],
    }
    html = render_cell(code, 1)
    assert "<img src=x" not in html and "&lt;b&gt;red" in html


def test_html_output_goes_to_a_scriptless_iframe() -> None:
    cell = {
        "cell_type": "code",
        "source": "",
        "outputs": [
            {"output_type": "display_data", "data": {"text/html": '<script>x()</script>"'}}
        ],
    }
    html = render_cell(cell, 0)
    assert '<iframe class="out html" sandbox=""' in html
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_images_only_as_data_urls_and_long_text_cut() -> None:
    cell = {
        "cell_type": "code",
        "source": "",
        "outputs": [
            {"output_type": "display_data", "data": {"image/png": "iVBOR\nw0KGgo="}},
            {"output_type": "stream", "name": "stdout", "text": "x" * (MAX_TEXT * 2)},
        ],
    }
    html = render_cell(cell, 0)
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in html
    assert len(html) < MAX_TEXT + 1000 and "characters ..." in html
