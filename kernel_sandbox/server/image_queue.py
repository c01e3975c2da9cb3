"""One image preparation per key at a time: a tenant's slow images wait for each other.

Resolving an image a sandbox has not used yet may take minutes (a pull, a probe, a
derivation).  Those run on a small pool of their own (see
:mod:`kernel_sandbox.backends.docker.images.derive`), and here each key gets one turn
at a time with at most :data:`~kernel_sandbox.limits.IMAGE_QUEUE_PER_KEY` waiting
behind it; more are refused with a CapacityError (429).  So one key naming eight slow
images holds one worker, and other keys' sandboxes start as before.  An image is new
until a sandbox of it started on this server (the server does not ask the engine
layer, which it must not import); after that, its creates need no turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..errors import CapacityError, ImageError
from ..limits import IMAGE_QUEUE_PER_KEY

__all__ = ["ImageQueue"]


@dataclass
class _Preparation:
    """One turn's preparation of an image, as the creates waiting for it see it."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: ImageError | None = None


class ImageQueue:
    """Per-key turns for image preparation (see the module docstring)."""

    def __init__(self, waiting: int = IMAGE_QUEUE_PER_KEY) -> None:
        self.waiting = waiting
        self._locks: dict[str, asyncio.Lock] = {}
        self._queued: dict[str, int] = {}
        #: (image, derive) of the sandboxes that started here: no preparation left.
        self._ready: set[tuple[str, bool]] = set()
        #: (owner, image, derive) whose turn is running.
        self._preparing: dict[tuple[str, str, bool], _Preparation] = {}

    def is_new(self, image: str, host: str, derive: bool) -> bool:
        """Whether starting ``image`` may mean engine work first (a pull, a derivation)."""
        return host == "docker" and (image, derive) not in self._ready

    def started(self, image: str, derive: bool) -> None:
        """A sandbox of ``image`` started: later ones need no turn."""
        self._ready.add((image, derive))

    @contextlib.asynccontextmanager
    async def turn(self, owner: str, image: str, derive: bool) -> AsyncIterator[None]:
        """Wait for ``owner``'s turn to prepare ``image`` (CapacityError when too many
        already wait).  Creates of an image the key's running turn prepares wait for
        that turn instead, uncounted, and need none of their own once it started a
        sandbox, nor another try when it found the image unusable (its ImageError is
        theirs): a burst of one image is one preparation, not a queue."""
        key = (owner, image, derive)
        preparing = self._preparing.get(key)
        if preparing is not None:
            await preparing.done.wait()
            if preparing.error is not None:
                raise preparing.error
        if (image, derive) in self._ready:
            yield
            return
        queued = self._queued.get(owner, 0)
        if queued > self.waiting:
            raise CapacityError(
                f"this key already has {queued} new images being prepared or waiting (the "
                f"server allows one at a time and {self.waiting} waiting); try again when "
                "they are ready"
            )
        self._queued[owner] = queued + 1  # until its turn ends
        lock = self._locks.setdefault(owner, asyncio.Lock())
        try:
            await lock.acquire()
        except BaseException:
            self._leave(owner)
            raise
        if (image, derive) in self._ready:  # prepared while this one waited: no turn
            lock.release()
            self._leave(owner)
            yield
            return
        preparation = self._preparing[key] = _Preparation()
        try:
            yield
        except ImageError as exc:
            preparation.error = exc  # the creates that waited for it fail with it
            raise
        finally:
            del self._preparing[key]
            preparation.done.set()
            lock.release()
            self._leave(owner)

    def _leave(self, owner: str) -> None:
        self._queued[owner] -= 1
        if not self._queued[owner]:
            del self._queued[owner]
            self._locks.pop(owner, None)
