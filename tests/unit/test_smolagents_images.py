"""The smolagents executor turns a sandbox's images into ``AgentImage``s, decoding on the
host only those within SMOLAGENTS_IMAGE_PIXELS (a PNG of a few kilobytes can claim
billions of pixels; decoding costs bytes of host memory per pixel)."""

from __future__ import annotations

import base64
import io

from PIL import Image

from kernel_sandbox.integrations.smolagents import _image
from kernel_sandbox.limits import SMOLAGENTS_IMAGE_PIXELS


def _png(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, format="PNG")  # one bit a pixel
    return base64.b64encode(buffer.getvalue()).decode()


def test_an_image_past_the_pixel_cap_is_not_decoded() -> None:
    small = _image(_png(640, 480))
    assert small is not None and small.to_raw().size == (640, 480)
    side = int(SMOLAGENTS_IMAGE_PIXELS**0.5) + 100  # just past the cap
    huge = _png(side, side)
    assert len(huge) < 1024**2  # a small payload that claims 40 M pixels
    assert _image(huge) is None
