"""Record a real sandbox session as a notebook, replay it, change it, export it."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from kernel_sandbox.cli.main import cli
from kernel_sandbox.config import DEFAULT_IMAGE
from kernel_sandbox.notebook import (
    META_KEY,
    NotebookRecorder,
    areplay,
    export_notebook,
    read_notebook,
)
from kernel_sandbox.sandbox import AsyncSandbox
from tests.conftest import TEST_LABEL

pytestmark = pytest.mark.integration

CSV = "city,temp\nOslo,4\nRome,18\nCairo,29\n"
STEPS = [
    "x = 21\nprint('x is', x)",
    "x * 2",
    "import pandas as pd\ndf = pd.read_csv('temps.csv')\ndf",
    "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
    "ax.bar(df.city, df.temp)\nax.set_title('temperatures')\nplt.show()",
    "object()",  # a memory address, different on every run
    "df.temp.mean() / 0 if False else 1 / 0",
]


async def record(sandbox: AsyncSandbox, path: Path) -> NotebookRecorder:
    rec = NotebookRecorder.attach(sandbox, path, title="temperatures")
    rec.add_user_message("Load temps.csv, show it and plot it.")
    # The file is written beside the kernel; the recorder gets its content explicitly
    # (as the agent loop does), detached so a sandbox file event is not recorded twice.
    rec.detach(sandbox)
    await sandbox.files.write("temps.csv", CSV)
    sandbox.listeners.append(rec)
    rec.add_file_operation("write", "temps.csv", content=CSV, metadata={"tool_call_id": "c0"})
    for code in STEPS:
        await sandbox.run_python(code)
    await sandbox.run_shell("wc -l < temps.csv; echo note >&2")
    rec.add_assistant_message("Rome is in the middle.")
    rec.finish("completed")
    return rec


async def test_recorded_session_replays_matches_and_reports_edits(
    make_sandbox, tmp_path: Path
) -> None:
    sandbox = await make_sandbox()
    path = tmp_path / "session.ipynb"
    await record(sandbox, path)
    await sandbox.close()

    nb = read_notebook(path)  # validates
    assert nb.metadata[META_KEY]["image"] == DEFAULT_IMAGE
    assert nb.metadata[META_KEY]["status"] == "completed"
    code = [c for c in nb.cells if c.cell_type == "code"]
    kinds = [c.metadata[META_KEY]["kind"] for c in code]
    assert kinds == ["file", "python", "python", "python", "python", "python", "python", "shell"]
    assert code[2].outputs[0].data["text/plain"] == "42"
    assert "<table" in code[3].outputs[0].data["text/html"]
    assert any("image/png" in o.get("data", {}) for o in code[4].outputs)
    assert code[6].outputs[-1].ename == "ZeroDivisionError"
    assert code[7].source.startswith("%%sh\n") and code[7].outputs[0].text.strip() == "4"
    assert [c.execution_count for c in code[1:7]] == [1, 2, 3, 4, 5, 6]

    html = export_notebook(path, "html")
    page = html.read_text()
    assert "<img" in page and "data:image/png;base64," in page

    runner = CliRunner()
    same = runner.invoke(cli, ["replay", str(path)])
    assert same.exit_code == 0, same.output
    assert "8 same" in same.output and "all cells match" in same.output
    replayed = read_notebook(tmp_path / "session.replay.ipynb")
    assert replayed.metadata[META_KEY]["replay"]["status"] == "ok"
    assert len(replayed.cells) == len(nb.cells)

    nb.cells[nb.cells.index(code[2])].source = "x * 3"  # a reader edits one cell
    nbformat.write(nb, tmp_path / "edited.ipynb")
    differs = runner.invoke(cli, ["replay", str(tmp_path / "edited.ipynb")])
    assert differs.exit_code == 1, differs.output
    assert "differs" in differs.output and "outputs differ" in differs.output
    assert "-[execute_result text/plain] 42" in differs.output
    assert "+[execute_result text/plain] 63" in differs.output


async def test_hand_written_jupyter_notebook_replays(docker_engine, tmp_path: Path) -> None:
    def cell(source: str, count: int, *outputs: dict) -> dict:
        return new_code_cell(source, execution_count=count, outputs=list(outputs))

    nb = new_notebook()  # as Jupyter writes it: no kernel_sandbox metadata at all
    nb.cells = [
        new_markdown_cell("# Scratch"),
        cell("a = 2\nprint(a * 10)", 1, new_output("stream", name="stdout", text="20\n")),
        cell(
            "import sys\nsys.version_info[0]",
            2,
            new_output("execute_result", data={"text/plain": "3"}, execution_count=2),
        ),
        cell("!echo from-bang", 3, new_output("stream", name="stdout", text="from-bang\n")),
        cell("%%bash\necho $((a + 1))", 4, new_output("stream", name="stdout", text="1\n")),
        cell("undefined_name", 5),  # Jupyter showed nothing?  The replay says what it sees.
    ]
    report = await areplay(nb, output=tmp_path / "r.ipynb", sandbox_options={"labels": TEST_LABEL})
    assert report.image == DEFAULT_IMAGE
    verdicts = [c.verdict for c in report.cells]
    assert verdicts == ["same", "same", "same", "same", "new error"], [c.diff for c in report.cells]
    assert "NameError" in report.cells[-1].diff
    assert not report.ok
    replayed = read_notebook(tmp_path / "r.ipynb")
    assert replayed.cells[4].outputs[0].text == "1\n"  # %%bash ran in the kernel's shell
