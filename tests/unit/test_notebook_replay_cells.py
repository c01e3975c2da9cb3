"""Replay per cell: tags as nbval reads them, display ids across cells, the console report.

The cells run for real on a local kernel (LocalKernelHost): each test's notebook holds
code whose true output is known, recorded with the output the test wants compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from click.testing import CliRunner
from nbformat.v4 import new_code_cell, new_notebook, new_output

from kernel_sandbox.cli.main import cli
from kernel_sandbox.notebook import META_KEY, areplay, export_notebook, read_notebook
from tests.unit.conftest import NewSandbox


def stdout(text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": "stdout", "text": text}


def error(ename: str, evalue: str, traceback: list[str] | None = None) -> dict[str, Any]:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback or []}


def text(value: str) -> dict[str, Any]:
    return {"output_type": "display_data", "data": {"text/plain": value}, "metadata": {}}


def cell(source: str, outputs: list[dict[str, Any]], tags: list[str] | None = None) -> Any:
    meta = {"tags": tags} if tags else {}
    made = [new_output(**o) for o in outputs]
    return new_code_cell(source, execution_count=1, outputs=made, metadata=meta)


async def test_tags_skip_ignore_expect_errors_and_compare_nondeterministic_shapes(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    nb = new_notebook()
    nb.cells = [
        # values of a nondeterministic cell are not compared, only the shape of its outputs
        cell("import random\nprint(random.random())", [stdout("0.12\n")], ["nondeterministic"]),
        cell(  # an output more than recorded: differs, tag or not
            "print(random.random())\ndisplay('extra')", [stdout("0.12\n")], ["nondeterministic"]
        ),
        cell("import time\nprint(time.time_ns())", [stdout("11\n")], ["nbval-ignore-output"]),
        cell("skipped_cell_ran = True", [stdout("x\n")], ["nbval-skip"]),
        cell("{}['b']", [error("KeyError", "'a'")], ["raises-exception"]),  # same by its name
        cell("print('fine')", [error("KeyError", "'a'")], ["raises-exception"]),  # no error
        cell("# NBVAL_IGNORE_OUTPUT\nprint('whatever')", [stdout("x\n")]),  # nbval's marker
    ]
    report = await areplay(nb, sandbox=sandbox)
    assert [c.verdict for c in report.cells] == [
        "same",
        "differs",
        "ignored",
        "skipped",
        "same",
        "differs",
        "ignored",
    ]
    ran = await sandbox.run_python("print('skipped_cell_ran' in globals())")
    assert ran.text.strip() == "False"  # a skipped cell never runs
    assert "expects an error" in report.cells[5].diff
    assert report.summary == "2 same, 2 differs, 2 ignored, 1 skipped"


async def test_raises_exception_tag_turns_a_new_error_into_an_expected_one(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    nb = new_notebook()
    nb.cells = [cell("raise ValueError('x')", [stdout("ok\n")]), cell("after = 1", [])]
    plain = await areplay(nb, sandbox=sandbox)
    assert [c.verdict for c in plain.cells] == ["new error", "same"]
    nb.cells[0].metadata["tags"] = ["raises-exception"]
    tagged = await areplay(nb, sandbox=sandbox)
    assert tagged.cells[0].verdict == "differs"  # its stdout is gone: still a change


async def test_display_updated_by_a_later_cell_is_judged_on_its_final_output(
    new_sandbox: NewSandbox,
) -> None:
    """As nbclient does: ``handle.update()`` in cell 2 rewrites cell 1's output."""
    sandbox = await new_sandbox()
    nb = new_notebook()
    nb.cells = [
        cell("h = display('x', display_id='d')", [text("'y'")]),  # Jupyter saved the update
        cell("h.update('y')", []),
    ]
    seen: list[int] = []
    report = await areplay(nb, sandbox=sandbox, on_cell=lambda c: seen.append(c.index))
    assert [c.verdict for c in report.cells] == ["same", "same"]
    assert report.notebook.cells[0].outputs[0].data["text/plain"] == "'y'"
    assert seen == [1, 0]  # the displaying cell is judged last, on its final output

    nb.cells[0].outputs[0].data["text/plain"] = "'z'"  # a recording that really differs
    report = await areplay(nb, sandbox=sandbox)
    assert report.cells[0].verdict == "differs" and "+[display_data text/plain] 'y'" in (
        report.cells[0].diff
    )


def test_console_names_the_cell_index_and_the_failing_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNEL_SANDBOX_HOST", "local")
    nb = new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("intro"),
        cell("%precision 3\nx = 1\n1/0", [stdout("1.0\n")]),
    ]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    result = CliRunner().invoke(cli, ["replay", str(path)])
    assert result.exit_code == 1, result.output
    line = next(ln for ln in result.output.splitlines() if "new error" in ln)
    assert line.startswith("cell 1 [In 1]") and line.rstrip().endswith("1/0")
    assert "%precision" not in line


async def test_html_export_shows_verdicts_and_loads_nothing_from_the_network(
    tmp_path: Path, new_sandbox: NewSandbox
) -> None:
    sandbox = await new_sandbox()
    nb = new_notebook()
    nb.cells = [
        cell("print(1)", [stdout("1\n")]),
        cell("print(3)", [stdout("2\n")]),
        nbformat.v4.new_markdown_cell("$x^2$ and <b>bold</b>"),
    ]
    out = tmp_path / "r.ipynb"
    await areplay(nb, output=out, sandbox=sandbox)
    page = export_notebook(out, "html").read_text()
    assert 'data-verdict="same"' in page and 'data-verdict="differs"' in page
    assert "-[stdout] 2" in page and "+[stdout] 3" in page
    assert "1 same, 1 differs" in page  # the replay summary heads the page
    for remote in ("<script src=", "require.js", "mathjax", "cdnjs", "unpkg", "<link "):
        assert remote not in page.lower(), remote
    assert read_notebook(out).cells[1].metadata[META_KEY]["replay"]["verdict"] == "differs"
