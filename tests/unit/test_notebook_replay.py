"""Replay and the replay/export commands on real local sandboxes (no engine).

Replays run on LocalKernelHost (``sandbox_options={"host": ...}``, or
``KERNEL_SANDBOX_HOST=local`` for the CLI); recorded files live under the test's
temporary directory.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import nbformat
import pytest
from click.testing import CliRunner
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from kernel_sandbox.cli.main import cli
from kernel_sandbox.config import DEFAULT_IMAGE, SandboxConfig
from kernel_sandbox.errors import NotebookError
from kernel_sandbox.notebook import (
    META_KEY,
    NotebookRecorder,
    areplay,
    export_notebook,
    read_notebook,
    replayed_path,
)
from kernel_sandbox.notebook.replay import _kernel_versions
from kernel_sandbox.results import CommandResult, Execution
from kernel_sandbox.testing import LocalKernelHost

from .conftest import NewSandbox, StandInPython

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 200).decode()


class Hosts(list[LocalKernelHost]):
    """A host factory for ``sandbox_options``: local hosts, remembered for the test."""

    def __call__(self, sandbox_id: str, config: SandboxConfig) -> LocalKernelHost:
        self.append(LocalKernelHost(sandbox_id, config))
        return self[-1]


@pytest.fixture
def hosts() -> Hosts:
    return Hosts()


def stdout(text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": "stdout", "text": text}


def record_session(path: Path) -> Path:
    """A recorded session whose files live in a ``files`` folder beside ``path``."""
    files = path.parent / "files"
    rec = NotebookRecorder(path, metadata={"image": "img:recorded"})
    rec.add_user_message("go")
    rec.add_python("print('a')", Execution("ok", [stdout("a\n")], 1))
    rec.add_shell("echo x", CommandResult(0, "x\n", ""))
    rec.add_file_operation("write", f"{files}/d.txt", content="1\n2\n")
    rec.add_python("print(0.7)", Execution("ok", [stdout("0.1\n")], 2))  # not what it gives
    rec.add_file_operation("write", f"{files}/blob.bin", content=b"\xff\x00")
    return files


async def test_cells_replay_the_way_they_were_recorded(tmp_path: Path, hosts: Hosts) -> None:
    path = tmp_path / "s.ipynb"
    files = record_session(path)
    report = await areplay(path, sandbox_options={"host": hosts})
    (host,) = hosts
    assert host.config.image == "img:recorded"
    assert not Path(host.working_dir).exists()  # closed: its directory is gone
    assert (files / "d.txt").read_text() == "1\n2\n"  # the write was redone
    assert not (files / "blob.bin").exists()  # its content was not recorded
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


async def test_edited_source_is_what_runs_and_a_new_error_is_reported(
    tmp_path: Path, hosts: Hosts
) -> None:
    path = tmp_path / "s.ipynb"
    record_session(path)
    nb = read_notebook(path)
    nb.cells[1].source = "print(b)"  # the user edited the first code cell
    report = await areplay(
        nb, image="img:override", output=tmp_path / "out.ipynb", sandbox_options={"host": hosts}
    )
    assert hosts[0].config.image == "img:override"
    assert report.cells[0].source == "print(b)"
    assert report.cells[0].verdict == "new error" and "NameError" in report.cells[0].diff
    assert (tmp_path / "out.ipynb").exists()


async def test_hand_written_notebook_runs_everything_in_the_kernel(
    tmp_path: Path, hosts: Hosts
) -> None:
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell("# by hand"),
        new_code_cell("print('a')", execution_count=1, outputs=[new_output("stream", text="a\n")]),
        new_code_cell("%%bash\necho hi"),  # never run: nothing to compare
        new_code_cell("   "),
    ]
    report = await areplay(nb, sandbox_options={"host": hosts})
    assert hosts[0].config.image == DEFAULT_IMAGE
    assert [c.source for c in report.cells] == ["print('a')", "%%bash\necho hi"]
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNEL_SANDBOX_HOST", "local")
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


async def test_a_module_in_the_working_directory_does_not_answer_the_kernel_probe(
    new_sandbox: NewSandbox,
) -> None:
    """The replay's version probe runs isolated (``-I``) in the working directory: a
    json.py there is not what it imports, so the answer is the kernel Python's."""
    sb = await new_sandbox()
    forged = (
        'import sys\nsys.stdout.write(\'{"language_info": {"name": "forged"}}\\n\')\nsys.exit(0)\n'
    )
    await sb.files.write("json.py", forged)
    versions = await _kernel_versions(sb)
    assert versions["language_info"]["name"] == "python" and "ipykernel" in versions, versions


async def test_a_kernel_probe_answer_past_its_bytes_is_no_answer(
    new_sandbox: NewSandbox, stand_in_python: StandInPython
) -> None:
    """The replay asks the sandbox's Python for its versions; that Python is the
    sandbox's own (an image's ``python3``; here its PATH's) and can answer anything: a
    valid answer past REPLAY_PROBE_BYTES is refused, never put into the replayed notebook."""
    sb = await new_sandbox(env_vars=stand_in_python.env)
    assert isinstance((await _kernel_versions(sb)).get("language_info"), dict)  # real
    pad = 100_000  # bytes: within run_shell's output cap, past REPLAY_PROBE_BYTES
    stand_in_python.set(
        'import sys\nsys.stdout.write(\'{"language_info": {"name": "python", '
        f"\"pad\": \"' + 'x' * {pad} + '\"}}}}\\n')\n"
    )
    versions = await _kernel_versions(sb)
    assert "could not ask the kernel for its versions" in versions.get("error", ""), versions
