"""Worker threads: one owner's blocking calls never take another owner's threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from kernel_sandbox.errors import CapacityError
from kernel_sandbox.limits import PROCESS_THREADS
from kernel_sandbox.threads import MAX_WORKERS, executor, in_process_thread, in_thread, owned_by


def test_an_owners_calls_run_on_its_own_threads() -> None:
    async def main() -> None:
        release = threading.Event()
        with owned_by("key-a"):
            # key A fills every thread it has with calls that wait
            held = [asyncio.ensure_future(in_thread(release.wait, 30)) for _ in range(MAX_WORKERS)]
            await asyncio.sleep(0.2)
        with owned_by("key-b"):
            name = await asyncio.wait_for(in_thread(lambda: threading.current_thread().name), 10)
        shared = await asyncio.wait_for(in_thread(lambda: threading.current_thread().name), 10)
        release.set()
        assert all(await asyncio.gather(*held))
        assert name.startswith("kernel-sandbox-key-b")
        assert shared.startswith("kernel-sandbox_")  # no owner: the shared executor
        assert executor("key-a") is not executor("key-b") is not executor()

    asyncio.run(main())


def test_process_threads_take_no_executor_thread_and_are_capped_per_owner() -> None:
    async def main() -> None:
        release = threading.Event()
        with owned_by("key-a"):
            # key A runs as many long processes as it may: none takes an executor thread
            held = [
                asyncio.ensure_future(in_process_thread(release.wait, 30))
                for _ in range(PROCESS_THREADS)
            ]
            await asyncio.sleep(0.2)
            short = await asyncio.wait_for(in_thread(lambda: "short"), 10)
            with pytest.raises(CapacityError, match="processes beside the kernel"):
                await in_process_thread(lambda: None)
        with owned_by("key-b"):  # another key's processes are not refused
            other = await asyncio.wait_for(in_process_thread(threading.current_thread), 10)
        release.set()
        assert all(await asyncio.gather(*held)) and short == "short"
        assert other.name.startswith("kernel-sandbox-process-key-b")
        with owned_by("key-a"):  # the threads ended: the owner's count is back to 0
            for _ in range(50):
                try:
                    await in_process_thread(lambda: None)
                    break
                except CapacityError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("key A's ended threads were still counted")
            with pytest.raises(ZeroDivisionError):  # an error reaches the caller
                await in_process_thread(lambda: 1 / 0)

        def given_up() -> None:  # what a thread's wait for a consumer that left raises
            raise concurrent.futures.CancelledError

        with pytest.raises(asyncio.CancelledError):  # a cancellation, never a traceback
            await in_process_thread(given_up)

    asyncio.run(main())
