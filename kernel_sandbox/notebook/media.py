"""Rich outputs reduced to what a reader sees: images by pixels, SVG as XML, HTML as text.

- **Raster images** (PNG, JPEG, GIF) are decoded with Pillow and compared as
  ``matplotlib.testing.compare.calculate_rms`` does: the root-mean-square difference
  of the RGB values (0-255, transparency composited onto white).  A re-rendered plot
  (another font hinting, another antialiasing) stays under
  :data:`DEFAULT_IMAGE_RMS`; a line drawn the other way, another curve or another
  colour does not.  Images of different pixel sizes cannot be compared pixel by
  pixel; they are compared by what does not depend on the size: a perceptual hash of
  the grey image (pHash: the signs of the lowest 8x8 DCT frequencies of the image
  scaled to 32x32, as the imagehash library computes it) for the shapes, and the mean
  hue of the coloured pixels for the colours.  Close on both gives the verdict "size
  only" (the same picture drawn at another size, e.g. matplotlib's old 432x288
  default); otherwise "differs".  Both sizes are reported either way.
- **SVG** is parsed as XML and compared as a canonical text: generated ids (which
  matplotlib derives from hashes) are renumbered in order of appearance, the
  ``<metadata>`` block (creation date, producer) is dropped, and numbers in
  attributes then go through the number tolerance.  A red and a blue circle differ.
- **HTML** is compared as its visible text, one table row per line and cells
  separated by tabs: pandas' changing ``<style>`` blocks and wrappers do not matter,
  the values in the table do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from .._extras import require_extra
from ..limits import MAX_IMAGE_PIXELS

__all__ = [
    "DEFAULT_HUE_SHIFT",
    "DEFAULT_IMAGE_RMS",
    "DEFAULT_SIZE_HASH_DISTANCE",
    "MAX_IMAGE_PIXELS",
    "Raster",
    "decode_raster",
    "html_text",
    "hue_shift",
    "image_rms",
    "perceptual_distance",
    "svg_canonical",
]

#: RMS difference (0-255 scale) under which two same-size images are the same picture.
#: A re-rendered matplotlib plot measures 0-3 here; a mirrored line about 10 and
#: more; pytest-mpl's default tolerance is 2.  See ``tests/unit/test_notebook_media.py``.
DEFAULT_IMAGE_RMS = 4.0
#: Hash bits (of 63) by which two images of different sizes may differ and still be the
#: same picture.  Measured on matplotlib plots: the same plot at 432x288 and 640x480
#: differs by 0-6, the corpus's 2015 plots redrawn by today's matplotlib (new style,
#: new margins) by 4-14; a line against its mirror image, a sine, a histogram, bars in
#: another order by 24-34.
DEFAULT_SIZE_HASH_DISTANCE = 18
#: Degrees by which the mean hue may move between sizes: matplotlib's old pure blue vs
#: today's tab:blue is 35; blue vs green 85, blue vs red 155.
DEFAULT_HUE_SHIFT = 60.0
_HASH_SIZE = 32
_HUE_SIDE = 512


@dataclass(frozen=True)
class Raster:
    """A decoded image: its size, and its RGB bytes when it was small enough to decode."""

    width: int
    height: int
    digest: str
    rgb: bytes | None = None

    @property
    def size(self) -> str:
        """``WIDTHxHEIGHT``."""
        return f"{self.width}x{self.height}"


def decode_raster(payload: str | list[str]) -> Raster | None:
    """A base64 image from a MIME bundle as pixels; None when it is not a readable image."""
    encoded = "".join(payload) if isinstance(payload, list) else payload
    try:
        raw = base64.b64decode(encoded)
    except (binascii.Error, ValueError):
        return None
    digest = hashlib.sha256(raw).hexdigest()[:16]
    with require_extra("notebook", "comparing images in a replay"):
        from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                return Raster(width, height, digest)
            image.load()
            if image.mode in ("RGBA", "LA", "P", "PA") or "transparency" in image.info:
                rgba = image.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                rgb = Image.alpha_composite(white, rgba).convert("RGB")
            else:
                rgb = image.convert("RGB")
            return Raster(width, height, digest, rgb.tobytes())
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None


def image_rms(a: Raster, b: Raster) -> float:
    """Root-mean-square difference of two same-size images (as matplotlib computes it)."""
    if a.digest == b.digest:
        return 0.0
    if a.rgb is None or b.rgb is None or (a.width, a.height) != (b.width, b.height):
        return float("inf")
    with require_extra("notebook", "comparing images in a replay"):
        import numpy as np

    x = np.frombuffer(a.rgb, dtype=np.uint8).astype(np.int32)
    y = np.frombuffer(b.rgb, dtype=np.uint8).astype(np.int32)
    x -= y
    x *= x  # at most 255**2: no overflow in int32
    return float(np.sqrt(x.sum(dtype=np.int64) / x.size))


def _image(raster: Raster) -> Any:
    with require_extra("notebook", "comparing images in a replay"):
        from PIL import Image

    assert raster.rgb is not None
    return Image.frombytes("RGB", (raster.width, raster.height), raster.rgb)


def _phash(raster: Raster) -> Any:
    """A 63-bit perceptual hash: signs of the lowest 8x8 DCT terms of the 32x32 grey image."""
    with require_extra("notebook", "comparing images in a replay"):
        import numpy as np
        from PIL import Image

    n = _HASH_SIZE
    k = np.arange(n)
    dct = np.cos(np.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * n))
    grey = _image(raster).convert("L").resize((n, n), Image.Resampling.LANCZOS)
    low = (dct @ np.asarray(grey, dtype=np.float64) @ dct.T)[:8, :8].flatten()[1:]
    return low > np.median(low)  # the DC (mean) term left out


def _hue(raster: Raster) -> float | None:
    """The mean hue (degrees) of the clearly coloured pixels, or None for a grey image."""
    with require_extra("notebook", "comparing images in a replay"):
        import numpy as np
        from PIL import Image

    image = _image(raster)
    scale = max(1, max(image.size) // _HUE_SIDE)
    if scale > 1:  # nearest pixels: a thin line keeps its full colour, unlike a blur
        image = image.resize(
            (image.width // scale, image.height // scale), Image.Resampling.NEAREST
        )
    rgb = np.asarray(image, dtype=np.float64) / 255
    top, low = rgb.max(axis=-1), rgb.min(axis=-1)
    chroma = top - low
    coloured = chroma > 0.25
    if coloured.mean() < 0.0002:
        return None
    r, g, b = (rgb[..., i][coloured] for i in range(3))
    c, m = chroma[coloured], top[coloured]
    hue = np.where(m == r, (g - b) / c % 6, np.where(m == g, (b - r) / c + 2, (r - g) / c + 4))
    angle = np.radians(hue * 60)
    mean = np.degrees(np.arctan2((np.sin(angle) * c).sum(), (np.cos(angle) * c).sum()))
    return float(mean % 360)


def perceptual_distance(a: Raster, b: Raster) -> int:
    """Hash bits (of 63) by which two pictures differ, whatever their sizes (0: alike)."""
    if a.digest == b.digest:
        return 0
    if a.rgb is None or b.rgb is None:
        return 64
    return int((_phash(a) != _phash(b)).sum())


def hue_shift(a: Raster, b: Raster) -> float:
    """Degrees between the mean hues of two pictures (180 when only one has colour)."""
    if a.rgb is None or b.rgb is None:
        return 0.0
    x, y = _hue(a), _hue(b)
    if x is None or y is None:
        return 0.0 if x is None and y is None else 180.0
    return abs((x - y + 180) % 360 - 180)


_SVG_NS = "{http://www.w3.org/2000/svg}"
_REFERENCE = re.compile(r"#([A-Za-z_][\w.\-]*)")


def svg_canonical(text: str) -> str | None:
    """A stable text form of an SVG document, or None when it does not parse.

    Documents that declare entities are not parsed (no entity expansion on the host).
    """
    if "<!ENTITY" in text:
        return None
    try:
        root = ET.fromstring(text.encode())
    except ET.ParseError:
        return None
    ids: dict[str, str] = {}
    for element in root.iter():
        if "id" in element.attrib:
            ids.setdefault(element.attrib["id"], f"id{len(ids)}")

    def rename(value: str) -> str:
        return _REFERENCE.sub(lambda m: "#" + ids.get(m.group(1), m.group(1)), value)

    lines: list[str] = []

    def walk(element: ET.Element, depth: int) -> None:
        tag = element.tag.replace(_SVG_NS, "")
        if tag == "metadata":
            return
        attrs = []
        for key, value in sorted(element.attrib.items()):
            value = ids.get(value, value) if key == "id" else rename(value)
            attrs.append(f"{key.split('}')[-1]}={value!r}")
        text = (element.text or "").strip()
        lines.append("  " * depth + " ".join([tag, *attrs]) + (f" {text!r}" if text else ""))
        for child in element:
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)


class _TextOfHtml(HTMLParser):
    """Collects visible text; table cells joined by tabs, rows and blocks by newlines."""

    _BLOCKS = frozenset({"p", "div", "br", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[list[str]] = [[]]
        self._skip = 0
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("style", "script"):
            self._skip += 1
        elif tag == "tr" or tag in self._BLOCKS:
            self._newline()
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script"):
            self._skip = max(0, self._skip - 1)
        elif tag in ("td", "th") and self._cell is not None:
            self.lines[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" or tag in self._BLOCKS:
            self._newline()

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._cell is not None:
            self._cell.append(data)
        elif data.strip():
            self.lines[-1].append(" ".join(data.split()))

    def _newline(self) -> None:
        if self.lines[-1]:
            self.lines.append([])


def html_text(html: str) -> str:
    """The visible text of an HTML fragment: tables as tab-separated rows."""
    parser = _TextOfHtml()
    parser.feed(html)
    parser.close()
    return "\n".join("\t".join(cells) for cells in parser.lines if cells)
