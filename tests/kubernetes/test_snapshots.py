"""Portable snapshots on a real cluster: pause deletes the pod, resume makes a new one
under the same sandbox id with the state back; forks are independent pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_sandbox import AsyncSandbox, LocalSnapshotStore
from tests.conftest import TEST_LABEL

pytestmark = pytest.mark.kubernetes


async def test_pause_deletes_the_pod_and_resume_brings_the_state_back(  # type: ignore[no-untyped-def]
    make_sandbox, tmp_path: Path
) -> None:
    store = LocalSnapshotStore(tmp_path / "snapshots")
    sb = await make_sandbox()
    await sb.run_python("import math\nstate = {'n': 1, 'f': lambda v: v + 1}")
    await sb.files.write("notes.txt", "kept")
    forks = await sb.fork(1, store=store)
    try:
        await forks[0].run_python("state['n'] = 2")
        assert (await sb.run_python("state['n']")).text == "1"
        snap = await sb.pause(store=store)
        assert snap.paused == sb.id
        assert await sb.host.list_sandboxes({"kernel-sandbox.id": sb.id}) == []  # pod gone
        resumed = await AsyncSandbox.resume(sb.id, store=store, labels=TEST_LABEL)
        try:
            assert resumed.id == sb.id  # a new pod (the old one was deleted), same name
            assert (await resumed.run_python("state['f'](state['n']), math.pi > 3")).text == (
                "(2, True)"
            )
            assert await resumed.files.read_text("notes.txt") == "kept"
        finally:
            await resumed.close()
    finally:
        for fork in forks:
            await fork.close()
