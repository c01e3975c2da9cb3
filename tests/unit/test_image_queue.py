"""The server's per-key turns for new images (``server/image_queue.py``)."""

from __future__ import annotations

import asyncio

import pytest

from kernel_sandbox.errors import CapacityError, ImageError
from kernel_sandbox.server.image_queue import ImageQueue

PREPARE = 0.2  # seconds a new image takes (a pull, a derivation)


class Creates:
    """Sandbox creates through the queue, as the tenancy makes them: the first of an
    image prepares it; what ran inside a turn at once is counted."""

    def __init__(
        self,
        queue: ImageQueue,
        fail: set[str] | None = None,
        error: type[Exception] = ImageError,
    ) -> None:
        self.queue = queue
        self.fail = fail or set()
        self.error = error
        self.preparing = self.most_preparing = self.prepared = 0

    async def create(self, owner: str, image: str) -> str:
        new = self.queue.is_new(image, "docker", False)
        if not new:
            return "started"
        async with self.queue.turn(owner, image, False):
            if (image, False) not in self.queue._ready:
                self.preparing += 1
                self.most_preparing = max(self.most_preparing, self.preparing)
                try:
                    await asyncio.sleep(PREPARE)
                finally:
                    self.preparing -= 1
                self.prepared += 1
                if image in self.fail:
                    raise self.error(f"{image} has no usable Python")
            self.queue.started(image, False)
        return "started"


async def test_a_cold_burst_of_one_image_is_one_preparation_and_none_refused() -> None:
    creates = Creates(ImageQueue(waiting=2))
    results = await asyncio.gather(*(creates.create("a", "default:1") for _ in range(16)))
    assert results == ["started"] * 16  # before: 13 of 16 refused past 2 waiting
    assert creates.prepared == 1


async def test_distinct_new_images_of_one_key_queue_up_to_the_cap() -> None:
    queue = ImageQueue(waiting=2)
    creates = Creates(queue)
    outcomes = await asyncio.gather(
        *(creates.create("a", f"slow:{n}") for n in range(5)), return_exceptions=True
    )
    refused = [o for o in outcomes if isinstance(o, CapacityError)]
    assert len(refused) == 2 and "2 waiting" in str(refused[0])  # one running + 2 waiting
    assert creates.most_preparing == 1 and creates.prepared == 3
    assert queue._queued == {} and queue._locks == {} and queue._preparing == {}


async def test_another_keys_new_image_does_not_wait_for_this_ones() -> None:
    creates = Creates(ImageQueue(waiting=2))
    slow = asyncio.gather(*(creates.create("a", f"slow:{n}") for n in range(3)))
    await asyncio.sleep(0.05)
    started = asyncio.get_running_loop().time()
    await creates.create("b", "theirs:1")
    assert asyncio.get_running_loop().time() - started < 2 * PREPARE
    await slow


async def test_a_failed_preparation_is_every_waiters_answer_without_another_try() -> None:
    creates = Creates(ImageQueue(waiting=2), fail={"bad:1"})
    outcomes = await asyncio.gather(
        *(creates.create("a", "bad:1") for _ in range(6)), return_exceptions=True
    )
    assert all(isinstance(o, ImageError) and "no usable Python" in str(o) for o in outcomes)
    assert creates.prepared == 1  # one probe for the burst, none refused past the cap
    later = await asyncio.gather(creates.create("a", "bad:1"), return_exceptions=True)
    assert isinstance(later[0], ImageError) and creates.prepared == 2  # a new create tries


async def test_a_failure_that_is_not_the_images_lets_the_waiters_try_in_turn() -> None:
    creates = Creates(ImageQueue(waiting=8), fail={"flaky:1"}, error=TimeoutError)
    outcomes = await asyncio.gather(
        *(creates.create("a", "flaky:1") for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, TimeoutError) for o in outcomes)
    assert creates.prepared == 3 and creates.most_preparing == 1  # one at a time


async def test_a_cancelled_waiter_leaves_no_count_behind() -> None:
    queue = ImageQueue(waiting=1)
    creates = Creates(queue)
    first = asyncio.create_task(creates.create("a", "slow:1"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(creates.create("a", "slow:2"))
    await asyncio.sleep(0.01)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await first == "started"
    assert queue._queued == {} and queue._locks == {}
