"""Images: kernel-ready image resolution (placeholder until the image builder lands)."""

from __future__ import annotations


async def resolve_kernel_image(image: str, *, derive: bool) -> str:
    """The image to start for ``image``."""
    return image
