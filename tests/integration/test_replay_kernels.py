"""Sessions in R, in Python and R together, and in python, R, JavaScript and bash
(kernel-sandbox:polyglot), recorded in real sandboxes and replayed.

The notebook of an R session says what Jupyter writes for IRkernel (kernelspec ``ir``,
R's ``language_info`` from the kernel itself); a mixed session's R cells carry VS
Code's ``vscode.languageId``; replay starts the same kernels and every cell is ``same``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernel_sandbox.backends.docker import docker_client
from kernel_sandbox.backends.docker.images import builder
from kernel_sandbox.notebook import META_KEY, NotebookRecorder, areplay
from tests.conftest import TEST_LABEL, require

pytestmark = pytest.mark.integration

R_IMAGE = "kernel-sandbox:r"
R_SESSION = [
    "x <- 21\nx * 2",
    'df <- data.frame(city = c("Oslo", "Rome"), temp = c(4, 18))\ndf',
    'cat("mean", mean(df$temp), "\\n")',
    'f <- function() stop("boom")\nf()',
    "library(ggplot2)\nggplot(df, aes(city, temp)) + geom_col() + ggtitle('temperatures')",
]


def _require_r() -> None:
    present = builder.image_exists(docker_client(), R_IMAGE) is not None
    require(present, f"{R_IMAGE} is not built (kernel-sandbox images build r)")


def _code(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code"]


async def test_a_recorded_r_session_is_an_ir_notebook_and_replays_the_same(
    make_sandbox: Any, tmp_path: Path
) -> None:
    _require_r()
    sandbox = await make_sandbox(image=R_IMAGE, kernel="ir", timeout=60)
    path = tmp_path / "r.ipynb"
    recorder = NotebookRecorder.attach(sandbox, path)
    results = [await sandbox.run_code(code) for code in R_SESSION]
    assert [r.status for r in results] == ["ok", "ok", "ok", "error", "ok"]
    assert any("image/png" in o.get("data", {}) for o in results[-1].outputs)
    recorder.finish()

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"] == {"name": "ir", "display_name": "R", "language": "R"}
    info = nb.metadata["language_info"]
    assert info["name"] == "R" and info["version"].startswith("4.")  # IRkernel's own reply
    assert info["file_extension"] == ".r" and info["mimetype"] == "text/x-r-source"
    code = _code(nb)
    assert [c.metadata[META_KEY]["kind"] for c in code] == ["code"] * 5
    assert {(c.metadata[META_KEY]["language"], c.metadata[META_KEY]["kernel"]) for c in code} == {
        ("r", "ir")
    }
    assert all("vscode" not in c.metadata for c in code)  # the notebook's own language

    report = await areplay(path, sandbox_options={"labels": TEST_LABEL, "timeout": 60})
    assert [c.verdict for c in report.cells] == ["same"] * 5, report.summary
    replayed = report.notebook.metadata
    assert replayed["language_info"]["name"] == "R"
    assert replayed[META_KEY]["replay"]["kernel"]["implementation"] == "IRkernel"


async def test_a_python_and_r_session_replays_each_cell_in_its_kernel(
    make_sandbox: Any, tmp_path: Path
) -> None:
    _require_r()
    sandbox = await make_sandbox(image=R_IMAGE, timeout=60)  # python3 is its own kernel
    path = tmp_path / "mixed.ipynb"
    recorder = NotebookRecorder.attach(sandbox, path)
    steps = [
        ("python", "x = 21\nprint(x * 2)"),
        ("r", 'y <- 5\nwrite.csv(data.frame(v = 1:3 * y), "v.csv", row.names = FALSE)\ny * 2'),
        ("python", "import csv\nprint([row['v'] for row in csv.DictReader(open('v.csv'))])"),
        ("r", "y + 1"),
        ("python", "x + 1"),
    ]
    results = [await sandbox.run_code(code, language=lang) for lang, code in steps]
    assert [r.status for r in results] == ["ok"] * 5
    assert results[2].stdout.strip() == "['5', '10', '15']"
    recorder.finish()

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["language_info"]["name"] == "python"
    code = _code(nb)
    ids = [c.metadata.get("vscode", {}).get("languageId") for c in code]
    assert ids == [None, "r", None, "r", None]
    contexts = [c.metadata[META_KEY]["context"] for c in code]
    assert contexts[0] == contexts[2] == contexts[4] == "default" != contexts[1] == contexts[3]

    report = await areplay(path, sandbox_options={"labels": TEST_LABEL, "timeout": 60})
    assert [c.verdict for c in report.cells] == ["same"] * 5, report.summary
    assert [c.kind for c in report.cells] == ["python", "code", "python", "code", "python"]
    assert [c.language for c in report.cells] == ["python", "r", "python", "r", "python"]


async def test_a_session_in_four_kernels_replays_each_cell_in_its_kernel(
    make_sandbox: Any, tmp_path: Path
) -> None:
    image = "kernel-sandbox:polyglot"
    require(builder.image_exists(docker_client(), image) is not None, f"{image} is not built")
    sandbox = await make_sandbox(image=image, timeout=60)
    path = tmp_path / "polyglot.ipynb"
    recorder = NotebookRecorder.attach(sandbox, path)
    steps = [
        ("python", "open('n.txt', 'w').write('6')\nprint('python wrote 6')"),
        ("r", "n <- as.integer(readLines('n.txt'))\nn * 7"),
        ("javascript", "const n = Number(Deno.readTextFileSync('n.txt'))\nn * 7"),
        ("bash", "n=$(cat n.txt); echo bash says $((n * 7))"),
        ("javascript", "`${n} still here`"),
        ("r", "n + 1"),
    ]
    results = [await sandbox.run_code(code, language=lang) for lang, code in steps]
    assert [r.status for r in results] == ["ok"] * 6, [r.message for r in results]
    recorder.finish()

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    ids = [c.metadata.get("vscode", {}).get("languageId") for c in _code(nb)]
    assert ids == [None, "r", "javascript", "shellscript", "javascript", "r"]
    report = await areplay(path, sandbox_options={"labels": TEST_LABEL, "timeout": 60})
    assert [c.verdict for c in report.cells] == ["same"] * 6, report.summary
    texts = [
        c.outputs[-1].get("text") or c.outputs[-1]["data"]["text/plain"]
        for c in _code(report.notebook)
    ]
    assert "42" in texts[1] and "42" in texts[2] and texts[3] == "bash says 42\n"
