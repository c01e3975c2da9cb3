"""Images by content, SVG as XML: a changed plot differs, the same plot re-drawn does not.

The thresholds here are the figures :data:`DEFAULT_IMAGE_RMS` is chosen from: a plot
drawn again measures 0, a thicker line (1.5 -> 1.6 pt, the kind of change a new
matplotlib makes) under 1, a line mirrored or recoloured more than 10.  Across sizes
the perceptual hash decides (:data:`DEFAULT_SIZE_HASH_DISTANCE`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import matplotlib
import numpy as np
import pytest

from kernel_sandbox.notebook import compare_outputs
from kernel_sandbox.notebook.media import (
    DEFAULT_IMAGE_RMS,
    decode_raster,
    html_text,
    image_rms,
    svg_canonical,
)

matplotlib.use("agg")
import matplotlib.pyplot as plt

X = np.linspace(0, 10, 50)
Draw = Callable[[Any], Any]


def figure(draw: Draw, fmt: str = "png", size: tuple[float, float] = (6.4, 4.8)) -> str:
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)
    raw = buffer.getvalue()
    return base64.b64encode(raw).decode() if fmt == "png" else raw.decode()


def plot(data: str, mime: str = "image/png") -> list[dict[str, Any]]:
    bundle = {mime: data, "text/plain": "<Figure size 640x480 with 1 Axes>"}
    return [{"output_type": "display_data", "data": bundle, "metadata": {}}]


def rising(ax: Any) -> None:
    ax.plot(X, X)


@pytest.mark.parametrize(
    "changed",
    [
        lambda ax: ax.plot(X, 10 - X),  # the same line, falling
        lambda ax: ax.plot(X, 5 + 5 * np.sin(X)),  # a sine wave instead
        lambda ax: ax.plot(X, X, color="red"),  # another colour
        lambda ax: ax.plot(X, X * 1.02),  # a 2 % steeper slope
    ],
)
def test_a_changed_plot_of_the_same_size_differs(changed: Draw) -> None:
    comparison = compare_outputs(plot(figure(rising)), plot(figure(changed)))
    assert comparison.verdict == "differs"
    assert "RMS difference" in comparison.diff and "640x480" in comparison.diff


def test_the_same_plot_drawn_again_or_with_a_hair_thicker_line_is_the_same() -> None:
    assert compare_outputs(plot(figure(rising)), plot(figure(rising))).same
    thicker = figure(lambda ax: ax.plot(X, X, lw=1.6))
    a, b = decode_raster(figure(rising)), decode_raster(thicker)
    assert a is not None and b is not None
    assert 0 < image_rms(a, b) < DEFAULT_IMAGE_RMS
    assert compare_outputs(plot(figure(rising)), plot(thicker)).same


def test_another_figure_size_is_size_only_with_both_sizes_and_does_not_fail() -> None:
    old = [
        {
            "output_type": "display_data",
            "data": {
                "image/png": figure(rising, size=(6, 4)),
                "text/plain": "<Figure size 432x288 with 1 Axes>",
            },
            "metadata": {},
        }
    ]
    comparison = compare_outputs(old, plot(figure(rising)))
    assert comparison.verdict == "size only"
    assert "600x400 recorded, 640x480 now" in comparison.diff
    # a size change next to a real change is still a change
    changed = [*plot(figure(rising)), {"output_type": "stream", "name": "stdout", "text": "2\n"}]
    assert compare_outputs([*old, changed[1]], changed).verdict == "size only"
    changed[1] = {"output_type": "stream", "name": "stdout", "text": "3\n"}
    assert compare_outputs([*old, {**changed[1], "text": "2\n"}], changed).verdict == "differs"


@pytest.mark.parametrize(
    "changed",
    [
        lambda ax: ax.plot(X, 10 - X),
        lambda ax: ax.plot(X, 5 + 5 * np.sin(X)),
        lambda ax: ax.plot(X, X, color="green"),
        lambda ax: ax.bar(["a", "b", "c"], [1, 3, 2]),
    ],
)
def test_a_changed_picture_at_another_size_differs_with_both_sizes(changed: Draw) -> None:
    old = plot(figure(rising, size=(6, 4)))
    comparison = compare_outputs(old, plot(figure(changed)))
    assert comparison.verdict == "differs"
    assert "600x400 recorded, 640x480 now, and the picture changed" in comparison.diff


def test_text_plain_beside_an_image_is_a_fallback_but_alone_it_is_compared() -> None:
    figure_repr = {"text/plain": "<matplotlib.figure.Figure at 0x10866ae90>"}
    new_repr = {"text/plain": "<Figure size 640x480 with 1 Axes>"}
    image = {"image/png": figure(rising)}
    shown = [{"output_type": "display_data", "data": {**image, **figure_repr}, "metadata": {}}]
    again = [{"output_type": "display_data", "data": {**image, **new_repr}, "metadata": {}}]
    assert compare_outputs(shown, again).same
    alone = [{"output_type": "display_data", "data": figure_repr, "metadata": {}}]
    assert compare_outputs(alone, [{**alone[0], "data": new_repr}]).verdict == "differs"


def test_unreadable_images_still_compare() -> None:
    fig = figure(rising)
    assert decode_raster("not base64!") is None
    broken = plot(base64.b64encode(b"\x89PNG broken").decode())
    assert compare_outputs(broken, broken).same
    assert compare_outputs(broken, plot(fig)).verdict == "differs"


def circle(colour: str, ident: str = "c1", date: str = "2020-01-01") -> str:
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        f'width="100" height="100"><metadata><date>{date}</date></metadata>'
        f'<defs><clipPath id="{ident}"><rect width="100" height="100"/></clipPath></defs>'
        f'<circle cx="50" cy="50" r="40" fill="{colour}" clip-path="url(#{ident})"/></svg>'
    )


def test_svg_compares_as_xml_ids_and_metadata_aside() -> None:
    red, blue = circle("red"), circle("blue")
    assert compare_outputs(plot(red, "image/svg+xml"), plot(blue, "image/svg+xml")).verdict == (
        "differs"
    )
    renamed = circle("red", ident="p8f3a9c2d1e", date="2026-12-01")
    assert compare_outputs(plot(red, "image/svg+xml"), plot(renamed, "image/svg+xml")).same


def test_matplotlib_svg_drawn_twice_is_the_same_and_a_mirrored_line_is_not() -> None:
    a, b = figure(rising, "svg"), figure(rising, "svg")
    falling = figure(lambda ax: ax.plot(X, 10 - X), "svg")
    assert compare_outputs(plot(a, "image/svg+xml"), plot(b, "image/svg+xml")).same
    assert not compare_outputs(plot(a, "image/svg+xml"), plot(falling, "image/svg+xml")).same


def test_svg_with_entities_is_not_expanded_on_the_host() -> None:
    bomb = '<!DOCTYPE svg [<!ENTITY a "aaaa">]><svg xmlns="http://www.w3.org/2000/svg">&a;</svg>'
    assert svg_canonical(bomb) is None
    assert compare_outputs(plot(bomb, "image/svg+xml"), plot(bomb, "image/svg+xml")).same


def test_html_text_keeps_table_rows_and_cells_and_drops_styles() -> None:
    html = (
        "<style>td {color: red}</style><p>Title</p><table><thead><tr><th></th><th>x</th></tr>"
        "</thead><tbody><tr><th>0</th><td>1.5</td></tr><tr><th>1</th><td>NaN</td></tr></tbody>"
        "</table><script>alert(1)</script>"
    )
    assert html_text(html) == "Title\n\tx\n0\t1.5\n1\tNaN"


def test_an_image_too_large_to_decode_is_compared_by_its_bytes() -> None:
    from PIL import Image

    def huge(colour: str) -> str:
        buffer = io.BytesIO()
        Image.new("RGB", (4000, 2100), colour).save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode()

    white, black = huge("white"), huge("black")
    raster = decode_raster(white)
    assert raster is not None and raster.rgb is None and raster.size == "4000x2100"
    assert compare_outputs(plot(white), plot(white)).same
    assert compare_outputs(plot(white), plot(black)).verdict == "differs"


def test_the_html_export_carries_no_live_script_from_outputs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from kernel_sandbox.notebook.export import export_notebook

    evil = '<script>alert(1)</script><img src=x onerror="alert(2)"><b>kept</b>'
    nb = new_notebook(
        cells=[
            new_code_cell(
                "x",
                outputs=[new_output("display_data", data={"text/html": evil, "text/plain": "x"})],
            )
        ]
    )
    path = tmp_path / "s.ipynb"
    nbformat.write(nb, path)
    html = export_notebook(path).read_text()
    assert "<script>alert(1)" not in html and "<img src=x onerror" not in html  # as text only
    assert "<b>kept</b>" in html
