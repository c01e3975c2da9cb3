"""Replay on a real kernel: the same notebook re-run passes, every changed value is caught,
and display ids end up exactly as nbclient leaves them.

The notebook is first executed by replay itself in the datascience image (so the
recording and the replay share every library version), then replayed as it is
(nothing may differ), then with one value changed per cell (each must differ).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from kernel_sandbox.notebook import areplay
from tests.integration.conftest import DATASCIENCE_IMAGE

pytestmark = pytest.mark.integration

SETUP = (
    "%matplotlib inline\nimport numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "from IPython.display import SVG, display"
)
# (source, the same source with one value changed)
PAIRS: list[tuple[str, str]] = [
    ("print(0.1 + 0.2)", "print(0.1 + 0.3)"),
    ("pd.Series([1, 2, 3, 4, 9]).describe()", "pd.Series([1, 2, 3, 4, 29]).describe()"),
    ("pd.Timestamp('2015-07-04 00:00:00')", "pd.Timestamp('2099-12-31 23:59:59')"),
    ("print(1500000000)", "print(1999999999)"),
    ("plt.plot([0, 1], [0, 1]);", "plt.plot([0, 1], [1, 0]);"),
    (
        "plt.plot(np.linspace(0, 6), np.linspace(0, 6));",
        "plt.plot(np.linspace(0, 6), np.sin(np.linspace(0, 6)));",
    ),
    (
        'SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="50" height="50">'
        '<circle cx="25" cy="25" r="20" fill="red"/></svg>\')',
        'SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="50" height="50">'
        '<circle cx="25" cy="25" r="20" fill="blue"/></svg>\')',
    ),
    ("pd.DataFrame({'a': [1.5, 2.5]})", "pd.DataFrame({'a': [1.5, 3.5]})"),
    (
        "rng = np.random.default_rng(7)\nrng.normal(size=3)",
        "rng = np.random.default_rng(8)\nrng.normal(size=3)",
    ),
    # the update changes nothing in its own cell: the display cell before it differs
    ("h.update('v2')", "h.update('v3')"),
]
DISPLAY = "h = display('v1', display_id='d')"
# noise only: the same source must pass
NOISE = [
    "%timeit sum(range(100))",
    "%time x = sum(range(1000))",
    "object()",
    "import uuid; uuid.uuid4()",
]


async def _executed(notebook: Any, make_sandbox: Any) -> Any:
    sandbox = await make_sandbox(image=DATASCIENCE_IMAGE)
    report = await areplay(notebook, sandbox=sandbox)
    await sandbox.close()
    return report


async def test_same_notebook_rerun_passes_and_every_changed_value_differs(
    make_sandbox: Any,
) -> None:
    cells = [SETUP, DISPLAY, *(a for a, _ in PAIRS), *NOISE]
    recorded = (
        await _executed(new_notebook(cells=[new_code_cell(c) for c in cells]), make_sandbox)
    ).notebook

    again = await _executed(recorded, make_sandbox)
    assert [c.verdict for c in again.cells] == ["same"] * len(cells), again.summary
    assert again.ok

    changed = nbformat.from_dict(recorded)
    for index, (_, new) in enumerate(PAIRS, start=2):
        changed.cells[index].source = new
    report = await _executed(changed, make_sandbox)
    verdicts = {c.source: c.verdict for c in report.cells}
    for _, new in PAIRS[:-1]:
        assert verdicts[new] == "differs", (new, report.cells_by_index)
    # the display cell was rewritten by the changed update, as Jupyter would show it
    assert verdicts[DISPLAY] == "differs" and verdicts[PAIRS[-1][1]] == "same"
    assert report.notebook.cells[1].outputs[0]["data"]["text/plain"] == "'v3'"
    assert "+[display_data text/plain] 'v3'" in report.cells_by_index[1].diff


DISPLAYS = [
    "from IPython.display import display, update_display",
    "h = display('x', display_id='a')\nh",
    "display('y', display_id='a')",  # a second display with the same id updates the first
    "h.update('z')",
    "display('p', display_id='b')\nupdate_display('q', display_id='b')\nprint('between')",
    "update_display('r', display_id='b')",
    "from IPython.display import clear_output\n"
    "display('c', display_id='c')\nclear_output(wait=True)",
    "update_display('c2', display_id='c')",
]


async def test_display_ids_across_cells_match_nbclient_output_for_output(
    make_sandbox: Any, tmp_path: Path
) -> None:
    """nbclient on a local kernel is the reference; the replay must save the same outputs."""
    from nbclient import NotebookClient

    reference = new_notebook(cells=[new_code_cell(c) for c in DISPLAYS])
    await NotebookClient(reference, kernel_name="python3", timeout=60).async_execute()
    report = await _executed(nbformat.from_dict(reference), make_sandbox)
    assert [c.verdict for c in report.cells] == ["same"] * len(DISPLAYS), report.summary
    for mine, theirs in zip(report.notebook.cells, reference.cells, strict=True):
        strip = [
            {k: v for k, v in o.items() if k not in ("execution_count", "metadata")}
            for o in theirs.outputs
        ]
        ours = [
            {k: v for k, v in o.items() if k not in ("execution_count", "metadata")}
            for o in mine.outputs
        ]
        assert ours == strip, mine.source
