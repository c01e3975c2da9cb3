"""Replay real public notebooks that nobody here wrote, and check every verdict by hand.

``tests/corpus/notebooks`` holds notebooks with stored outputs from IPython's examples,
nbclient's and nbval's test files (sources, commits and licences in
``tests/corpus/SOURCES.md``).  Each is replayed in the datascience image, and every
code cell's verdict must equal ``tests/corpus/expected.json``, which was written by
reading each cell's recorded and replayed outputs side by side (a note says why for
every verdict that is not ``same``).  A failure prints the cell's diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox.notebook import areplay, read_notebook
from tests.integration.conftest import DATASCIENCE_IMAGE

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).parent.parent / "corpus"
EXPECTED: dict[str, dict[str, Any]] = json.loads((CORPUS / "expected.json").read_text())


def test_every_corpus_notebook_has_hand_checked_verdicts_and_a_source() -> None:
    notebooks = {p.stem for p in (CORPUS / "notebooks").glob("*.ipynb")}
    assert notebooks == set(EXPECTED)
    sources = (CORPUS / "SOURCES.md").read_text()
    for name in notebooks:
        assert f"notebooks/{name}.ipynb" in sources, name
        nb = read_notebook(CORPUS / "notebooks" / f"{name}.ipynb")
        code = {
            str(i) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()
        }
        assert code == set(EXPECTED[name]), name
        for verdict in EXPECTED[name].values():
            if isinstance(verdict, str):
                assert verdict == "same", f"{name}: a verdict other than same needs a note"


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_corpus_notebook_replays_with_the_verdicts_checked_by_hand(
    name: str, make_sandbox: Any, tmp_path: Path
) -> None:
    sandbox = await make_sandbox(image=DATASCIENCE_IMAGE)
    report = await areplay(
        CORPUS / "notebooks" / f"{name}.ipynb",
        sandbox=sandbox,
        output=tmp_path / f"{name}.replay.ipynb",
        timeout=120,
    )
    expected = {k: v if isinstance(v, str) else v[0] for k, v in EXPECTED[name].items()}
    got = {str(c.index): c.verdict for c in report.cells}
    by_index = report.cells_by_index
    wrong = {
        index: f"expected {expected.get(index)}, got {verdict}\n{by_index[int(index)].diff}"
        for index, verdict in got.items()
        if expected.get(index) != verdict
    }
    assert not wrong and got.keys() == expected.keys(), "\n".join(
        f"cell {i}: {why}" for i, why in wrong.items()
    )
