"""Notebooks of sessions in several kernels, on LocalKernelHost with a real bash_kernel
beside ipykernel: the kernelspec and language_info the kernel gave, each cell's language
where Jupyter tools read it, and a replay that runs each cell in the kernel it ran in."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from kernel_sandbox.limits import NOTEBOOK_LANGUAGE_INFO_CHARS
from kernel_sandbox.notebook import META_KEY, NotebookRecorder, areplay
from kernel_sandbox.notebook.languages import bounded_language_info, cell_language
from tests.unit.conftest import NewSandbox


@pytest.fixture(autouse=True)
def _bash(bash_kernelspec: None) -> None:
    """Every test here has bash_kernel's kernelspec (tests/unit/conftest.py)."""


async def test_a_bash_session_is_a_bash_notebook_and_replays_the_same(
    new_sandbox: NewSandbox, tmp_path: Path
) -> None:
    sandbox = await new_sandbox(kernel="bash")
    path = tmp_path / "bash.ipynb"
    recorder = NotebookRecorder.attach(sandbox, path)
    assert (await sandbox.run_code("n=6; echo $((n * 7))")).stdout.strip() == "42"
    assert (await sandbox.run_code("echo n is $n")).stdout.strip() == "n is 6"
    recorder.finish()
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"] == {
        "name": "bash",
        "display_name": "Bash",
        "language": "bash",
    }
    assert nb.metadata["language_info"]["name"] == "bash"  # bash_kernel's own words
    assert nb.metadata["language_info"]["mimetype"] == "text/x-sh"
    assert nb.metadata[META_KEY]["sandbox"]["kernel"] == "bash"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.metadata[META_KEY]["kind"] for c in code] == ["code", "code"]
    assert all("vscode" not in c.metadata for c in code)  # the notebook's own language

    report = await areplay(path, sandbox_options={"host": "local", "startup_timeout": 120})
    assert [c.verdict for c in report.cells] == ["same", "same"], report.summary
    assert report.notebook.metadata["language_info"]["name"] == "bash"


async def test_a_python_and_bash_session_replays_each_cell_in_its_kernel(
    new_sandbox: NewSandbox, tmp_path: Path
) -> None:
    sandbox = await new_sandbox()
    path = tmp_path / "mixed.ipynb"
    recorder = NotebookRecorder.attach(sandbox, path)
    await sandbox.run_code("x = 21\nprint(x * 2)")
    await sandbox.run_code("y=5; echo bash $y > from-bash.txt; echo $y", language="bash")
    await sandbox.files.mkdir("sub")
    other = await sandbox.create_context("bash", cwd="sub")
    await sandbox.run_code("y=9; echo other $y in $(basename $PWD)", context=other)
    await sandbox.run_code("echo still $y", language="bash")  # the first bash context's y
    await sandbox.run_code("print(x, open('from-bash.txt').read().strip())")
    recorder.finish()
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["language_info"]["name"] == "python"
    code = [c for c in nb.cells if c.metadata[META_KEY]["kind"] in ("python", "code")]
    ids = [c.metadata.get("vscode", {}).get("languageId") for c in code]
    assert ids == [None, "shellscript", "shellscript", "shellscript", None]
    places = [cell_language(c) for c in code]
    assert [p.language for p in places] == ["python", "bash", "bash", "bash", "python"]
    assert places[0].context == places[4].context == "default"
    assert places[1].context == places[3].context != places[2].context == other.id
    assert [c.outputs[0]["text"] for c in code[1:4]] == ["5\n", "other 9 in sub\n", "still 5\n"]
    assert code[2].metadata[META_KEY]["context_cwd"].endswith("/sub")
    assert "context_cwd" not in code[1].metadata[META_KEY]  # started in the working dir

    report = await areplay(path, sandbox_options={"host": "local", "startup_timeout": 120})
    assert [c.verdict for c in report.cells] == ["same"] * 6, report.summary  # mkdir too
    replayed = [c for c in report.notebook.cells if c.metadata[META_KEY]["kind"] != "file"]
    assert replayed[2].outputs[0]["text"] == "other 9 in sub\n"  # started where it had
    assert replayed[3].outputs[0]["text"] == "still 5\n"  # its context kept its own y


async def test_a_cell_that_names_only_its_vscode_language_replays_in_that_kernel(
    new_sandbox: NewSandbox,
) -> None:
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "P", "language": "python"}}
    )
    nb.cells = [
        nbformat.v4.new_code_cell(
            "echo $((6 * 7))", metadata={"vscode": {"languageId": "shellscript"}}
        ),
        nbformat.v4.new_code_cell("print(6 * 7)"),
    ]
    sandbox = await new_sandbox()
    report = await areplay(nb, sandbox=sandbox)
    texts = [c.outputs[0]["text"] for c in report.notebook.cells]
    assert texts == ["42\n", "42\n"]
    assert [c.language for c in sandbox.list_contexts()] == ["python", "bash"]


def test_a_kernels_words_about_itself_are_bounded_in_the_notebook() -> None:
    huge = "9" * 1_000_000
    info = bounded_language_info(
        {
            "name": "r" + huge,
            "version": huge,
            "mimetype": ["not", "a", "string"],
            "codemirror_mode": {"name": huge, "version": 3, "extra": huge},
            "extra": huge,
        }
    )
    assert info is not None
    assert set(info) == {"name", "version", "codemirror_mode"}
    assert len(info["name"]) == len(info["version"]) == NOTEBOOK_LANGUAGE_INFO_CHARS
    assert info["codemirror_mode"] == {"name": huge[:NOTEBOOK_LANGUAGE_INFO_CHARS], "version": 3}
    assert bounded_language_info({"version": "4"}) is None  # no name: not a language_info
    nb = nbformat.v4.new_notebook(metadata={"language_info": info})
    nbformat.validate(nb)
