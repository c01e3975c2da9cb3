"""Compare a cell's recorded outputs with a replay's: what a reader would call the same.

Outputs are first reduced to :class:`Item` values: runs of consecutive stream outputs
merged per stream (how chunks and stdout/stderr interleave depends on timing); errors
reduced to ``Name: value`` (tracebacks name cell numbers and temp files); each entry
of a MIME bundle on its own, except a ``text/plain`` fallback beside a representation
that Jupyter shows instead (an image, HTML, LaTeX...): readers never see it, and for
a plot it is a repr like ``<Figure size 640x480 with 1 Axes>``.  Text goes through
:func:`~.normalise.normalise_text` and then matches when it differs only in floats
within :class:`Tolerance`; images, SVG and HTML are compared as :mod:`.media`
describes.  ``execution_count`` and output metadata are ignored.  The docs'
"What replay ignores" table sums this up.

Verdicts: ``same``; ``differs``; ``size only`` (every difference is a raster image
that shows the same picture at another pixel size, by its perceptual hash: both
sizes are reported, and it does not fail a replay); ``new error`` (the replay raised where
the recording did not).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .media import (
    DEFAULT_HUE_SHIFT,
    DEFAULT_IMAGE_RMS,
    DEFAULT_SIZE_HASH_DISTANCE,
    Raster,
    decode_raster,
    html_text,
    hue_shift,
    image_rms,
    perceptual_distance,
    svg_canonical,
)
from .normalise import (
    DEFAULT_ABS_TOL,
    DEFAULT_REL_TOL,
    NumberTolerance,
    normalise_text,
    texts_match,
)

__all__ = [
    "CellVerdict",
    "Comparison",
    "Item",
    "Tolerance",
    "compare_outputs",
    "normalise_outputs",
    "normalise_text",
]

CellVerdict = Literal["same", "differs", "size only", "new error"]
_TEXT_MIMES = ("text/", "application/json", "application/javascript", "application/xml")
_RASTERS = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp")


@dataclass(frozen=True)
class Tolerance:
    """How different a replayed output may be and still be called the same.

    ``rel_tol`` / ``abs_tol`` apply to floats in text (integers must be equal);
    ``image_rms`` is the largest RMS difference (0-255) between same-size images;
    ``size_hash_distance`` and ``hue_shift`` how far apart images of different
    sizes may be (perceptual hash bits, mean hue in degrees) to count as the same
    picture ("size only").
    """

    rel_tol: float = DEFAULT_REL_TOL
    abs_tol: float = DEFAULT_ABS_TOL
    image_rms: float = DEFAULT_IMAGE_RMS
    size_hash_distance: int = DEFAULT_SIZE_HASH_DISTANCE
    hue_shift: float = DEFAULT_HUE_SHIFT

    @property
    def numbers(self) -> NumberTolerance:
        """The tolerance for numbers in text."""
        return NumberTolerance(self.rel_tol, self.abs_tol)


@dataclass(frozen=True)
class Item:
    """One comparable piece of output: a stream, one MIME bundle entry, or an error."""

    kind: str  # "stdout", "stderr", "execute_result", "display_data", "error"
    mime: str = ""
    text: str = ""
    raster: Raster | None = field(default=None, compare=False)

    @property
    def shape(self) -> tuple[str, str]:
        """What the item is, without its value (for ``nondeterministic`` cells)."""
        return (self.kind, self.mime)

    def render(self) -> str:
        """The item as text for a diff."""
        label = self.kind if not self.mime else f"{self.kind} {self.mime}"
        return f"[{label}]\n{self.text}" if "\n" in self.text else f"[{label}] {self.text}"


def _raster_item(kind: str, mime: str, payload: Any) -> Item:
    raster = decode_raster(payload) if isinstance(payload, str | list) else None
    if raster is None:
        return Item(kind, mime, "<unreadable image>")
    return Item(kind, mime, f"<{mime} {raster.size}>", raster)


#: MIME types a front end shows instead of ``text/plain`` (nbconvert's and JupyterLab's
#: display priority); ``text/plain`` beside one of them is a fallback nobody reads.
_SHOWN_BEFORE_PLAIN = frozenset(
    {
        "application/javascript",
        "text/html",
        "text/markdown",
        "text/latex",
        "image/svg+xml",
        "application/pdf",
        *_RASTERS,
    }
)


def _bundle_items(kind: str, data: Mapping[str, Any]) -> list[Item]:
    items = []
    richer = any(mime in _SHOWN_BEFORE_PLAIN for mime in data)
    for mime in sorted(data):
        if mime == "text/plain" and richer:
            continue
        value = data[mime]
        text = "".join(value) if isinstance(value, list) else value
        if mime in _RASTERS:
            items.append(_raster_item(kind, mime, value))
        elif mime == "image/svg+xml" and isinstance(text, str):
            canonical = svg_canonical(text)
            items.append(Item(kind, mime, canonical if canonical is not None else text))
        elif mime == "text/html" and isinstance(text, str):
            items.append(Item(kind, mime, normalise_text(html_text(text))))
        elif mime.startswith(_TEXT_MIMES) or mime.endswith(("+json", "+xml")):
            if not isinstance(text, str):
                text = json.dumps(text, sort_keys=True, default=str)
            items.append(Item(kind, mime, normalise_text(text)))
        else:  # another binary type (PDF...): its bytes, as base64 text
            digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
            items.append(Item(kind, mime, f"<{mime} sha256:{digest[:16]}>"))
    return items


def normalise_outputs(outputs: Iterable[Mapping[str, Any]]) -> list[Item]:
    """nbformat v4 outputs as a list of comparable items (see the module docstring)."""
    items: list[Item] = []
    streams: dict[str, str] = {}

    def flush() -> None:
        for name in sorted(streams):
            text = normalise_text(streams[name])
            if text:
                items.append(Item(name, text=text))
        streams.clear()

    for out in outputs:
        kind = out.get("output_type", "")
        if kind == "stream":
            name = str(out.get("name", "stdout"))
            text = out.get("text", "")
            streams[name] = streams.get(name, "") + (
                "".join(text) if isinstance(text, list) else text
            )
            continue
        flush()
        if kind == "error":
            text = normalise_text(f"{out.get('ename')}: {out.get('evalue')}")
            items.append(Item("error", str(out.get("ename", "")), text))
        elif kind in ("execute_result", "display_data"):
            items.extend(_bundle_items(kind, out.get("data", {})))
    flush()
    return items


@dataclass(frozen=True)
class Comparison:
    """The verdict on one cell, with a short diff when it is not ``same``."""

    verdict: CellVerdict
    diff: str = ""

    @property
    def same(self) -> bool:
        """True when the outputs match after normalisation."""
        return self.verdict == "same"


def _match(a: Item, b: Item, tol: Tolerance, notes: list[str]) -> Literal["yes", "no", "size"]:
    """Whether two items match; a note explains an image verdict."""
    if a.shape != b.shape:
        return "no"
    if a.raster is not None and b.raster is not None:
        if (a.raster.width, a.raster.height) != (b.raster.width, b.raster.height):
            sizes = f"{a.raster.size} recorded, {b.raster.size} now"
            distance = perceptual_distance(a.raster, b.raster)
            shift = hue_shift(a.raster, b.raster)
            if distance <= tol.size_hash_distance and shift <= tol.hue_shift:
                notes.append(f"{a.mime}: size only: {sizes} (the same picture)")
                return "size"
            why = (
                f"shapes: perceptual distance {distance} > {tol.size_hash_distance}"
                if distance > tol.size_hash_distance
                else f"colours: hue moved {shift:.0f}° > {tol.hue_shift:g}°"
            )
            notes.append(f"{a.mime}: {sizes}, and the picture changed ({why})")
            return "no"
        rms = image_rms(a.raster, b.raster)
        if rms <= tol.image_rms:
            return "yes"
        shown = "bytes differ" if rms == float("inf") else f"RMS difference {rms:.1f}"
        notes.append(f"{a.mime} {a.raster.size}: {shown} > {tol.image_rms:g}")
        return "no"
    return "yes" if texts_match(a.text, b.text, tol.numbers) else "no"


def compare_outputs(
    expected: Iterable[Mapping[str, Any]],
    actual: Iterable[Mapping[str, Any]],
    *,
    tolerance: Tolerance | None = None,
    values: bool = True,
    expect_error: bool = False,
    max_diff_lines: int = 12,
) -> Comparison:
    """Compare recorded outputs with replayed ones (see the module docstring).

    ``values=False`` compares only what the outputs are (streams, MIME types, error
    names), for cells tagged ``nondeterministic``.  ``expect_error`` (the
    ``raises-exception`` tag) makes an error the expected outcome: errors then match
    by name, and a replay that does not raise differs.
    """
    tol = tolerance or Tolerance()
    want, got = normalise_outputs(expected), normalise_outputs(actual)
    notes: list[str] = []
    if expect_error:
        want = [Item(i.kind, i.mime, i.mime) if i.kind == "error" else i for i in want]
        got = [Item(i.kind, i.mime, i.mime) if i.kind == "error" else i for i in got]
        if not any(i.kind == "error" for i in got):
            notes.append("the raises-exception tag expects an error; the replay raised none")
    if not values:
        want = [Item(*i.shape) for i in want]
        got = [Item(*i.shape) for i in got]
    results = (
        [_match(a, b, tol, notes) for a, b in zip(want, got, strict=True)]
        if len(want) == len(got)
        else ["no"]
    )
    if not notes and all(r == "yes" for r in results):
        return Comparison("same")
    new_error = any(i.kind == "error" for i in got) and not any(i.kind == "error" for i in want)
    verdict: CellVerdict = "differs"
    if new_error and not expect_error:
        verdict = "new error"
    elif "no" not in results and len(want) == len(got):
        verdict = "size only"
    return Comparison(verdict, _diff(want, got, notes, max_diff_lines))


def _diff(want: list[Item], got: list[Item], notes: list[str], max_lines: int) -> str:
    lines = list(
        difflib.unified_diff(
            "\n".join(i.render() for i in want).splitlines(),
            "\n".join(i.render() for i in got).splitlines(),
            "recorded",
            "replayed",
            n=1,
            lineterm="",
        )
    )[2:]
    lines = [*notes, *lines] if lines else notes or ["(only numbers beyond the tolerance differ)"]
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... ({len(lines) - max_lines} more diff lines)"]
    return "\n".join(lines)
