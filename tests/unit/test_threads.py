"""Worker threads: one owner's blocking calls never take another owner's threads."""

from __future__ import annotations

import asyncio
import threading

from kernel_sandbox.threads import MAX_WORKERS, executor, in_thread, owned_by


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
