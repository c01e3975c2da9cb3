"""Compare a cell's recorded outputs with a replay's, ignoring what always changes.

Outputs are first reduced to :class:`Item` values: text with memory addresses,
durations, wall-clock timestamps, UUIDs, temp paths and ANSI colours replaced by
placeholders; runs of consecutive stream outputs merged per stream (how chunks and
stdout/stderr interleave depends on timing); errors reduced to ``Name: value``
(tracebacks name cell numbers and temp files).  Images are compared by type,
pixel size (PNG) and byte size within a factor of two, never byte by byte: a plot
re-rendered by another library version is still the same plot.  ``execution_count``
and output metadata are ignored.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..results import strip_ansi

__all__ = [
    "CellVerdict",
    "Comparison",
    "Item",
    "compare_outputs",
    "normalise_outputs",
    "normalise_text",
]

CellVerdict = Literal["same", "differs", "new error"]

_SUBSTITUTIONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"0x[0-9a-fA-F]{6,16}\b"), "0x…"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"/tmp/ipykernel_\d+/\d+\.py"), "<cell>"),
    (re.compile(r"/tmp/tmp[a-z0-9_]{6,}"), "/tmp/<tmp>"),
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\b"
        ),
        "<datetime>",
    ),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}\.\d{3,}\b"), "<time>"),
    (re.compile(r"\b1[5-9]\d{8}(?:\.\d+)?\b"), "<epoch>"),
    (
        re.compile(
            r"\b\d+(?:\.\d+)?(?:e-?\d+)?\s?(?:ns|µs|us|ms|s|sec|secs|seconds|min)\b"
            r"(?=[^a-zA-Z]|$)"
        ),
        "<duration>",
    ),
]
_SPACES = re.compile(r"[ \t]+\n")
_TEXT_MIMES = ("text/", "application/json", "application/javascript")
#: Two images of the same plot may differ this much in encoded size.
IMAGE_SIZE_FACTOR = 2.0


def normalise_text(text: str | list[str]) -> str:
    """Text with ANSI codes, addresses, timings, timestamps and trailing spaces neutralised."""
    if isinstance(text, list):
        text = "".join(text)
    text = strip_ansi(text).replace("\r\n", "\n")
    for pattern, placeholder in _SUBSTITUTIONS:
        text = pattern.sub(placeholder, text)
    return _SPACES.sub("\n", text).rstrip()


@dataclass(frozen=True)
class Item:
    """One comparable piece of output: a stream, one MIME bundle entry, or an error."""

    kind: str  # "stdout", "stderr", "execute_result", "display_data", "error"
    mime: str = ""
    text: str = ""
    image_size: int = 0
    pixels: tuple[int, int] | None = None

    @property
    def is_image(self) -> bool:
        """True for binary (or SVG) images, compared loosely."""
        return self.mime.startswith("image/")

    def matches(self, other: Item) -> bool:
        """Equal, or for images: same type, same pixel size, similar byte size."""
        if not (self.is_image and other.is_image):
            return self == other
        if (self.kind, self.mime, self.pixels) != (other.kind, other.mime, other.pixels):
            return False
        small, big = sorted((max(self.image_size, 1), max(other.image_size, 1)))
        return big / small <= IMAGE_SIZE_FACTOR

    def render(self) -> str:
        """The item as text for a diff."""
        if self.is_image:
            dims = f" {self.pixels[0]}x{self.pixels[1]}" if self.pixels else ""
            return f"[{self.kind}] <{self.mime}{dims}, {_kb(self.image_size)}>"
        label = self.kind if not self.mime else f"{self.kind} {self.mime}"
        return f"[{label}]\n{self.text}" if "\n" in self.text else f"[{label}] {self.text}"


def _kb(n: int) -> str:
    return f"{n} B" if n < 1024 else f"~{round(n / 1024)} KB"


def _png_pixels(raw: bytes) -> tuple[int, int] | None:
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or len(raw) < 24:
        return None
    width, height = struct.unpack(">II", raw[16:24])
    return int(width), int(height)


def _image_item(kind: str, mime: str, payload: Any) -> Item:
    if mime == "image/svg+xml" or not isinstance(payload, str | list):
        text = "".join(payload) if isinstance(payload, list) else str(payload)
        return Item(kind, mime, image_size=len(text.encode()))
    encoded = "".join(payload) if isinstance(payload, list) else payload
    try:
        raw = base64.b64decode(encoded)
    except (binascii.Error, ValueError):
        raw = encoded.encode()
    return Item(kind, mime, image_size=len(raw), pixels=_png_pixels(raw))


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
            items.append(
                Item("error", text=normalise_text(f"{out.get('ename')}: {out.get('evalue')}"))
            )
        elif kind in ("execute_result", "display_data"):
            data: Mapping[str, Any] = out.get("data", {})
            for mime in sorted(data):
                if mime.startswith("image/"):
                    items.append(_image_item(kind, mime, data[mime]))
                elif mime.startswith(_TEXT_MIMES) or mime.endswith("+json"):
                    value = data[mime]
                    text = value if isinstance(value, str | list) else _json_text(value)
                    items.append(Item(kind, mime, text=normalise_text(text)))
                else:
                    items.append(Item(kind, mime, text="<binary>"))
    flush()
    return items


def _json_text(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Comparison:
    """The verdict on one cell, with a short diff when it is not ``same``."""

    verdict: CellVerdict
    diff: str = ""

    @property
    def same(self) -> bool:
        """True when the outputs match after normalisation."""
        return self.verdict == "same"


def _error_of(items: list[Item]) -> Item | None:
    return next((i for i in items if i.kind == "error"), None)


def compare_outputs(
    expected: Iterable[Mapping[str, Any]],
    actual: Iterable[Mapping[str, Any]],
    *,
    max_diff_lines: int = 12,
) -> Comparison:
    """Compare recorded outputs with replayed ones (normalised; see the module docstring)."""
    want, got = normalise_outputs(expected), normalise_outputs(actual)
    if len(want) == len(got) and all(a.matches(b) for a, b in zip(want, got, strict=True)):
        return Comparison("same")
    new_error = _error_of(got)
    verdict: CellVerdict = "new error" if new_error and not _error_of(want) else "differs"
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
    if not lines:  # only image sizes differ beyond the tolerance, or equal renders
        lines = ["(outputs differ in ways the text view does not show, e.g. image size)"]
    if len(lines) > max_diff_lines:
        lines = [*lines[:max_diff_lines], f"... ({len(lines) - max_diff_lines} more diff lines)"]
    return Comparison(verdict, "\n".join(lines))
