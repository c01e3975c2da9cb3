"""One image preparation per key at a time: a tenant's slow images wait for each other.

Resolving an image a sandbox has not used yet may take minutes (a pull, a probe, a
derivation).  Those run on a small pool of their own (see
:mod:`kernel_sandbox.backends.docker.images.derive`), and here each key gets one turn
at a time with at most :data:`~kernel_sandbox.limits.IMAGE_QUEUE_PER_KEY` waiting
behind it; more are refused with a CapacityError (429).  So one key naming eight slow
images holds one worker, and other keys' sandboxes start as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..errors import CapacityError
from ..limits import IMAGE_QUEUE_PER_KEY

__all__ = ["ImageQueue", "needs_preparation"]


def needs_preparation(image: str, host: str, derive: bool) -> bool:
    """Whether starting ``image`` may mean engine work first (not resolved yet)."""
    if host != "docker":
        return False  # the cluster's kubelet pulls; nothing runs on this server
    from ..backends.docker.images.derive import is_resolved

    return not is_resolved(image, derive)


class ImageQueue:
    """Per-key turns for image preparation (see the module docstring)."""

    def __init__(self, waiting: int = IMAGE_QUEUE_PER_KEY) -> None:
        self.waiting = waiting
        self._locks: dict[str, asyncio.Lock] = {}
        self._queued: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def turn(self, owner: str) -> AsyncIterator[None]:
        """Wait for ``owner``'s turn (CapacityError when too many already wait)."""
        queued = self._queued.get(owner, 0)
        if queued > self.waiting:
            raise CapacityError(
                f"this key already has {queued} new images being prepared or waiting (the "
                f"server allows one at a time and {self.waiting} waiting); try again when "
                "they are ready"
            )
        self._queued[owner] = queued + 1
        lock = self._locks.setdefault(owner, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            self._queued[owner] -= 1
            if not self._queued[owner]:
                del self._queued[owner]
                self._locks.pop(owner, None)
