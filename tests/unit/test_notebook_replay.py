"""Replay and the replay/export commands against a scripted stand-in sandbox (no engine)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from click.testing import CliRunner
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from kernel_sandbox.cli.main import cli
from kernel_sandbox.config import DEFAULT_IMAGE
from kernel_sandbox.errors import NotebookError
from kernel_sandbox.notebook import (
    META_KEY,
    NotebookRecorder,
    areplay,
    export_notebook,
    read_notebook,
    replayed_path,
)
from kernel_sandbox.results import CommandResult, Execution

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 200).decode()
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


def stdout(text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": "stdout", "text": text}


def record_session(path: Path) -> None:
    rec = NotebookRecorder(path, metadata={"image": "img:recorded"})
    rec.add_user_message("go")
    rec.add_python("print('a')", Execution("ok", [stdout("a\n")], 1))
    rec.add_shell("echo x", CommandResult(0, "ran echo x\n", ""))
    rec.add_file_operation("write", "/sandbox/d.txt", content="1\n2\n")
    rec.add_python("print(total)", Execution("ok", [stdout("0.1\n")], 2))
    rec.add_file_operation("write", "/sandbox/blob.bin", content=b"\xff\x00")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeSandbox]:
    made: list[FakeSandbox] = []
    script = {
        "print('a')": [stdout("a\n")],
        "print(total)": [stdout("0.7\n")],
        "print(b)": [
            {"output_type": "error", "ename": "NameError", "evalue": "b", "traceback": []}
        ],
    }

    async def create(**options: Any) -> FakeSandbox:
        made.append(FakeSandbox(script, **options))
        return made[-1]

    from kernel_sandbox import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module.AsyncSandbox, "create", staticmethod(create))
    return made


async def test_cells_replay_the_way_they_were_recorded(
    tmp_path: Path, fake: list[FakeSandbox]
) -> None:
    path = tmp_path / "s.ipynb"
    record_session(path)
    report = await areplay(path)
    (sandbox,) = fake
    assert sandbox.options["image"] == "img:recorded" and sandbox.closed
    assert sandbox.calls == [
        ("python", "print('a')"),
        ("shell", "echo x"),
        ("write", "/sandbox/d.txt=1\n2\n"),
        ("python", "print(total)"),
    ]
    verdicts = [(c.kind, c.verdict) for c in report.cells]
    assert verdicts == [
        ("python", "same"),
        ("shell", "same"),
        ("file", "same"),
        ("python", "differs"),
        ("file", "skipped"),
    ]
    assert not report.ok
    assert "-[stdout] 0.1" in report.cells[3].diff and "+[stdout] 0.7" in report.cells[3].diff
    assert report.summary == "3 same, 1 differs, 1 skipped"
    replayed = read_notebook(replayed_path(path))
    assert report.output == replayed_path(path) == tmp_path / "s.replay.ipynb"
    code = [c for c in replayed.cells if c.cell_type == "code"]
    assert code[3].outputs[0].text == "0.7\n"
    assert code[3].metadata[META_KEY]["replay"]["verdict"] == "differs"
    assert replayed.metadata[META_KEY]["replay"]["status"] == "differs"
    # the report people read: recorded outputs and the diff stay in the cell
    meta = code[3].metadata[META_KEY]["replay"]
    assert meta["recorded_outputs"][0]["text"] == "0.1\n"
    assert "+[stdout] 0.7" in meta["diff"]
    assert "recorded_outputs" not in code[0].metadata[META_KEY]["replay"]  # same: not kept
    # language_info and versions are the replay kernel's, the recorded ones kept aside
    assert replayed.metadata.language_info["version"] == "3.11.2"
    assert replayed.metadata[META_KEY]["replay"]["kernel"]["ipython"] == "9.0.0"
    assert "version" not in replayed.metadata[META_KEY]["replay"]["recorded_language_info"]


async def test_edited_source_is_what_runs_and_a_new_error_is_reported(
    tmp_path: Path, fake: list[FakeSandbox]
) -> None:
    path = tmp_path / "s.ipynb"
    record_session(path)
    nb = read_notebook(path)
    nb.cells[1].source = "print(b)"  # the user edited the first code cell
    report = await areplay(nb, image="img:override", output=tmp_path / "out.ipynb")
    assert fake[0].options["image"] == "img:override"
    assert fake[0].calls[0] == ("python", "print(b)")
    assert report.cells[0].verdict == "new error" and "NameError: b" in report.cells[0].diff
    assert (tmp_path / "out.ipynb").exists()


async def test_hand_written_notebook_runs_everything_in_the_kernel(
    tmp_path: Path, fake: list[FakeSandbox]
) -> None:
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell("# by hand"),
        new_code_cell("print('a')", execution_count=1, outputs=[new_output("stream", text="a\n")]),
        new_code_cell("%%bash\necho hi"),  # never run: nothing to compare
        new_code_cell("   "),
    ]
    report = await areplay(nb)
    assert fake[0].options == {"image": DEFAULT_IMAGE}
    assert fake[0].calls == [("python", "print('a')"), ("python", "%%bash\necho hi")]
    assert [c.verdict for c in report.cells] == ["same", "unrecorded"]
    assert report.ok and report.output is None


def test_unreadable_notebook_is_a_notebook_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    with pytest.raises(NotebookError, match="cannot read"):
        read_notebook(bad)
    result = CliRunner().invoke(cli, ["export", str(bad)])
    assert result.exit_code != 0 and isinstance(result.exception, NotebookError)


def test_replay_command_exit_status_follows_the_comparison(
    tmp_path: Path, fake: list[FakeSandbox]
) -> None:
    path = tmp_path / "s.ipynb"
    record_session(path)
    runner = CliRunner()
    differs = runner.invoke(cli, ["replay", str(path), "--timeout", "5"])
    assert differs.exit_code == 1, differs.output
    assert "replaying" in differs.output and "img:recorded" in differs.output
    assert "differs" in differs.output and "+[stdout] 0.7" in differs.output
    assert "outputs differ" in differs.output

    nb = read_notebook(path)
    del nb.cells[4:]  # keep the cells that replay identically
    nbformat.write(nb, tmp_path / "good.ipynb")
    out = tmp_path / "elsewhere.ipynb"
    same = runner.invoke(cli, ["replay", str(tmp_path / "good.ipynb"), "-o", str(out)])
    assert same.exit_code == 0, same.output
    assert "all cells match" in same.output and out.exists()


def test_export_html_embeds_plots_and_py_is_a_script(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    rec = NotebookRecorder(path)
    rec.add_python(
        "plot()",
        Execution(
            "ok", [{"output_type": "display_data", "data": {"image/png": PNG}, "metadata": {}}]
        ),
    )
    rec.add_shell("ls", CommandResult(0, "a\n", ""))
    runner = CliRunner()
    html = runner.invoke(cli, ["export", str(path), "--to", "html"])
    assert html.exit_code == 0, html.output
    page = (tmp_path / "s.html").read_text()
    assert "<img" in page and f"data:image/png;base64,{PNG[:40]}" in page
    target = tmp_path / "out" / "script.py"
    py = runner.invoke(cli, ["export", str(path), "--to", "py", "-o", str(target)])
    assert py.exit_code == 0 and py.output.strip() == str(target)
    script = target.read_text()
    assert "plot()" in script and "run_cell_magic('sh'" in script
    assert export_notebook(path).suffix == ".html"
