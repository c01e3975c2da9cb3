"""Cell tags: read as nbval reads them, and set by the recorder when a cell cannot repeat."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_sandbox.notebook import META_KEY, NotebookRecorder
from kernel_sandbox.notebook.tags import cell_tags, nondeterminism
from kernel_sandbox.results import Execution


def test_tags_come_from_metadata_and_nbval_comment_markers() -> None:
    cell = {
        "source": "# NBVAL_IGNORE_OUTPUT\n#NBVAL_SKIP\nx  # NBVAL_RAISES_EXCEPTION is not a marker",
        "metadata": {"tags": ["nbval-raises-exception", "mine", 3]},
    }
    assert cell_tags(cell) == {"nbval-ignore-output", "nbval-skip", "raises-exception", "mine"}
    assert cell_tags({"source": "x", "metadata": {"tags": "not a list"}}) == set()


@pytest.mark.parametrize(
    "code",
    [
        "%timeit sum(range(10))",
        "%%time\nfit()",
        "start = time.perf_counter()",
        "print(datetime.now())",
        "np.random.rand(3)",
        "random.random()",
        "rng = np.random.default_rng()",
        "uuid.uuid4()",
    ],
)
def test_timed_clock_and_unseeded_random_code_is_recognised(code: str) -> None:
    assert nondeterminism(code)


@pytest.mark.parametrize(
    "code",
    [
        "np.random.seed(0); np.random.rand(3)",
        "rng = np.random.default_rng(42); rng.normal()",
        "train_test_split(X, y, random_state=0)",
        "df.describe()",
        "print('timeit')",
    ],
)
def test_seeded_or_ordinary_code_is_deterministic(code: str) -> None:
    assert nondeterminism(code) is None


def test_recorder_tags_timed_and_random_cells_and_what_the_agent_marks(tmp_path: Path) -> None:
    rec = NotebookRecorder(tmp_path / "s.ipynb")  # each result is its own object
    rec.add_python("%timeit f()", Execution("ok"))
    rec.add_python("np.random.rand()", Execution("ok"))  # unseeded: random
    rec.add_python("x = 1", Execution("ok"))
    rec.add_python("sample()", Execution("ok"), {"nondeterministic": True})  # the agent knows
    rec.add_python("np.random.seed(1)", Execution("ok"))
    rec.add_python("np.random.rand()", Execution("ok"))  # seeded by an earlier cell: repeatable
    cells = [c for c in rec.notebook.cells if c.cell_type == "code"]
    tagged = [c.metadata.get("tags", []) == ["nondeterministic"] for c in cells]
    assert tagged == [True, True, False, True, False, False]
    assert "timed" in cells[0].metadata[META_KEY]["nondeterministic"]
    assert cells[3].metadata[META_KEY]["nondeterministic"] == "marked by the agent"
