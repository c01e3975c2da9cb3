"""Back to a recorded cell, on real sandboxes: a session rewound to any cell of its
notebook, and the variables a portable snapshot could not save made again by replaying
the cells that bound them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_sandbox import AsyncSandbox, LocalSnapshotStore, arebuild, arewind
from kernel_sandbox.notebook import META_KEY, NotebookRecorder, read_notebook
from kernel_sandbox.notebook.rewind import bound_names
from tests.integration.conftest import TEST_LABEL

pytestmark = pytest.mark.integration


async def _record(sandbox: AsyncSandbox, path: Path, cells: list[str]) -> None:
    recorder = NotebookRecorder.attach(sandbox, path)
    for code in cells:
        ran = await sandbox.run_python(code)
        assert ran.status == "ok", ran.text
    recorder.finish()


async def test_a_session_rewinds_to_any_recorded_cell(py_sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "session.ipynb"
    await _record(py_sandbox, path, ["x = 1", "x += 10", "x *= 100", "print(x)"])
    cells = read_notebook(path).cells
    at = next(i for i, c in enumerate(cells) if c.cell_type == "code" and c.source == "x += 10")
    rewound = await arewind(path, at, sandbox_options={"labels": TEST_LABEL})
    try:
        assert rewound.report.ok, rewound.report.summary
        assert (await rewound.sandbox.run_python("print(x)")).stdout.strip() == "11"
        assert rewound.report.notebook.metadata[META_KEY]["rewound_from"] == {
            "notebook": str(path),
            "cell": at,
        }
        assert rewound.sandbox.id != py_sandbox.id  # a fork: the session goes on apart
        assert (await py_sandbox.run_python("print(x)")).stdout.strip() == "1100"
    finally:
        await rewound.sandbox.close()


async def test_what_a_snapshot_could_not_save_is_rebuilt_from_the_notebook(  # type: ignore[no-untyped-def]
    py_sandbox, tmp_path
) -> None:
    path = tmp_path / "session.ipynb"
    await _record(
        py_sandbox,
        path,
        [
            "data = [3, 1, 2]",
            "log = open('log.txt', 'a')\nlog.write('opened;')",
            "squares = (v * v for v in data)",
            "total = sum(data)",
        ],
    )
    store = LocalSnapshotStore(tmp_path / "snapshots")
    snap = await py_sandbox.snapshot(store=store)
    assert {"log", "squares"} <= set(snap.not_saved)
    restored = await AsyncSandbox.restore(snap, store=store, labels=TEST_LABEL)
    try:
        missing = await restored.run_python("squares")
        assert missing.status == "error"  # not saved, so not there
        rebuilt = await arebuild(restored, path, snap)
        assert set(rebuilt.rebuilt) >= {"log", "squares"} and rebuilt.failed == {}
        back = await restored.run_python("print(next(squares), log.closed, total)")
        assert back.stdout.strip() == "9 False 6", back.text
    finally:
        await restored.close()


def test_the_names_a_cell_binds() -> None:
    source = (
        "import numpy as np, os.path\nfrom json import loads as L\nx, (y, z) = 1, (2, 3)\n"
        "w += 1\nv: int = 2\ndef f(): q = 1\nclass C: pass\nfor i in range(3): pass\n"
        "with open('f') as fh: pass\nprint(unbound)\n%time x\n"
    )
    assert bound_names(source) == {"np", "os", "L", "x", "y", "z", "w", "v", "f", "C", "i", "fh"}
    assert bound_names("%%bash\necho x=1") == set()
    assert bound_names("def broken(:") == set()
