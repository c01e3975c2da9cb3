"""Replay per cell: tags as nbval reads them, display ids across cells, the console report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from click.testing import CliRunner
from nbformat.v4 import new_code_cell, new_notebook, new_output

from kernel_sandbox.cli.main import cli
from kernel_sandbox.notebook import META_KEY, areplay, export_notebook, read_notebook
from kernel_sandbox.results import CommandResult, Execution

KERNEL_INFO = {
    "language_info": {"name": "python", "version": "3.11.2", "mimetype": "text/x-python"},
    "python": "3.11.2",
    "ipython": "9.0.0",
    "ipykernel": "7.0.0",
}


class FakeFiles:
    def __init__(self, calls: list[tuple[str, str]]) -> None:
        self.calls = calls

    async def write(self, path: str, data: str) -> None:
        self.calls.append(("write", f"{path}={data}"))

    async def append(self, path: str, data: str) -> None:
        self.calls.append(("append", f"{path}={data}"))


def stdout(text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": "stdout", "text": text}


class FakeSandbox:
    """Answers code from a script: {code: outputs}; unknown code prints nothing."""

    def __init__(self, script: dict[str, list[dict[str, Any]]], **options: Any) -> None:
        self.script, self.options = script, options
        self.calls: list[tuple[str, str]] = []
        self.files = FakeFiles(self.calls)
        self.closed = False
        self.count = 0

    async def run_python(self, code: str, timeout: float | None = None) -> Execution:
        self.calls.append(("python", code))
        self.count += 1
        answer = self.script.get(code, [])
        if isinstance(answer, Execution):
            return answer
        status = "error" if any(o["output_type"] == "error" for o in answer) else "ok"
        return Execution(status, answer, self.count)  # type: ignore[arg-type]

    async def run_shell(self, command: str, timeout: float | None = None) -> CommandResult:
        if "IPythonKernel.language_info" in command:  # replay asks for the kernel's versions
            return CommandResult(0, json.dumps(KERNEL_INFO) + "\n", "")
        self.calls.append(("shell", command))
        return CommandResult(0, f"ran {command}\n", "")

    async def close(self) -> None:
        self.closed = True


TRACEBACK = [
    "\x1b[0;31m---------------------------------------------------------------------------\x1b[0m",
    "\x1b[0;31mZeroDivisionError\x1b[0m    Traceback (most recent call last)",
    "Cell \x1b[0;32mIn[3], line 2\x1b[0m\n\x1b[1;32m      1\x1b[0m x = 1\n"
    "\x1b[0;32m----> 2\x1b[0m \x1b[38;5;241m1\x1b[39m\x1b[38;5;241m/"
    "\x1b[39m\x1b[38;5;241m0\x1b[39m\n",
    "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero",
]


def error(ename: str, evalue: str, traceback: list[str] | None = None) -> dict[str, Any]:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback or []}


def text(value: str) -> dict[str, Any]:
    return {"output_type": "display_data", "data": {"text/plain": value}, "metadata": {}}


def cell(source: str, outputs: list[dict[str, Any]], tags: list[str] | None = None) -> Any:
    meta = {"tags": tags} if tags else {}
    made = [new_output(**o) for o in outputs]
    return new_code_cell(source, execution_count=1, outputs=made, metadata=meta)


@pytest.fixture
def sandbox_for(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(script: dict[str, Any]) -> FakeSandbox:
        fake = FakeSandbox(script)

        async def create(**options: Any) -> FakeSandbox:
            return fake

        from kernel_sandbox import sandbox as sandbox_module

        monkeypatch.setattr(sandbox_module.AsyncSandbox, "create", staticmethod(create))
        return fake

    return make


async def test_tags_skip_ignore_expect_errors_and_compare_nondeterministic_shapes(
    sandbox_for: Any,
) -> None:
    fake = sandbox_for(
        {
            "random()": [stdout("0.93\n")],
            "random() ": [stdout("0.93\n"), text("extra")],
            "now()": [stdout("12:00\n")],
            "raise_it()": [error("KeyError", "'b'")],
            "quiet()": [stdout("fine\n")],
            "# NBVAL_IGNORE_OUTPUT\nnoisy()": [stdout("whatever\n")],
        }
    )
    nb = new_notebook()
    nb.cells = [
        cell("random()", [stdout("0.12\n")], ["nondeterministic"]),  # values: not compared
        cell("random() ", [stdout("0.12\n")], ["nondeterministic"]),  # an extra output: differs
        cell("now()", [stdout("11:00\n")], ["nbval-ignore-output"]),
        cell("skipped()", [stdout("x\n")], ["nbval-skip"]),
        cell("raise_it()", [error("KeyError", "'a'")], ["raises-exception"]),  # by name
        cell("quiet()", [error("KeyError", "'a'")], ["raises-exception"]),  # did not raise
        cell("# NBVAL_IGNORE_OUTPUT\nnoisy()", [stdout("x\n")]),  # nbval's comment marker
    ]
    report = await areplay(nb)
    assert [c.verdict for c in report.cells] == [
        "same",
        "differs",
        "ignored",
        "skipped",
        "same",
        "differs",
        "ignored",
    ]
    assert ("python", "skipped()") not in fake.calls  # a skipped cell never runs
    assert "expects an error" in report.cells[5].diff
    assert report.summary == "2 same, 2 differs, 2 ignored, 1 skipped"


async def test_raises_exception_tag_turns_a_new_error_into_an_expected_one(
    sandbox_for: Any,
) -> None:
    sandbox_for({"boom()": [error("ValueError", "x")]})
    nb = new_notebook()
    nb.cells = [cell("boom()", [stdout("ok\n")]), cell("boom() # again", [])]
    plain = await areplay(nb)
    assert plain.cells[0].verdict == "new error"
    nb.cells[0].metadata["tags"] = ["raises-exception"]
    tagged = await areplay(nb)
    assert tagged.cells[0].verdict == "differs"  # its stdout is gone: still a change


async def test_display_updated_by_a_later_cell_is_judged_on_its_final_output(
    sandbox_for: Any,
) -> None:
    """As nbclient does: ``handle.update()`` in cell 2 rewrites cell 1's output."""
    shown = Execution("ok", [text("'x'")], 1, display_ids={"d": [0]})
    update = Execution(
        "ok", [], 2, display_updates={"d": {"data": {"text/plain": "'y'"}, "metadata": {}}}
    )
    sandbox_for({"h = display('x', display_id='d')": shown, "h.update('y')": update})
    nb = new_notebook()
    nb.cells = [
        cell("h = display('x', display_id='d')", [text("'y'")]),  # Jupyter saved the update
        cell("h.update('y')", []),
    ]
    seen: list[int] = []
    report = await areplay(nb, on_cell=lambda c: seen.append(c.index))
    assert [c.verdict for c in report.cells] == ["same", "same"]
    assert report.notebook.cells[0].outputs[0].data["text/plain"] == "'y'"
    assert seen == [1, 0]  # the displaying cell is judged last, on its final output

    nb.cells[0].outputs[0].data["text/plain"] = "'z'"  # a recording that really differs
    report = await areplay(nb)
    assert report.cells[0].verdict == "differs" and "+[display_data text/plain] 'y'" in (
        report.cells[0].diff
    )


def test_console_names_the_cell_index_and_the_failing_line(
    tmp_path: Path, sandbox_for: Any
) -> None:
    sandbox_for(
        {
            "%matplotlib inline\nx = 1\n1/0": [
                error("ZeroDivisionError", "division by zero", TRACEBACK)
            ]
        }
    )
    nb = new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("intro"),
        cell("%matplotlib inline\nx = 1\n1/0", [stdout("1.0\n")]),
    ]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    result = CliRunner().invoke(cli, ["replay", str(path)])
    assert result.exit_code == 1
    line = next(ln for ln in result.output.splitlines() if "new error" in ln)
    assert line.startswith("cell 1 [In 1]") and line.rstrip().endswith("1/0")
    assert "%matplotlib" not in line


async def test_html_export_shows_verdicts_and_loads_nothing_from_the_network(
    tmp_path: Path, sandbox_for: Any
) -> None:
    sandbox_for({"a()": [stdout("1\n")], "b()": [stdout("3\n")]})
    nb = new_notebook()
    nb.cells = [
        cell("a()", [stdout("1\n")]),
        cell("b()", [stdout("2\n")]),
        nbformat.v4.new_markdown_cell("$x^2$ and <b>bold</b>"),
    ]
    out = tmp_path / "r.ipynb"
    await areplay(nb, output=out)
    page = export_notebook(out, "html").read_text()
    assert 'data-verdict="same"' in page and 'data-verdict="differs"' in page
    assert "-[stdout] 2" in page and "+[stdout] 3" in page
    assert "1 same, 1 differs" in page  # the replay summary heads the page
    for remote in ("<script src=", "require.js", "mathjax", "cdnjs", "unpkg", "<link "):
        assert remote not in page.lower(), remote
    assert read_notebook(out).cells[1].metadata[META_KEY]["replay"]["verdict"] == "differs"
