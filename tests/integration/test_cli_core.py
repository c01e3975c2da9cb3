"""CLI commands of the core: run, shell, ps, gc (orphans of a killed process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernel_sandbox.cli.main import cli

pytestmark = pytest.mark.integration

ORPHAN_MAKER = """
import sys
from kernel_sandbox.sync import Sandbox
sb = Sandbox.create(image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"})
print(sb.id, flush=True)
sys.stdin.read()  # wait to be killed
"""


def test_run_prints_outputs_saves_images_and_fails_on_error(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = "print('hello')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
    ok = CliRunner().invoke(cli, ["run", "-c", code, "--save-images", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert "hello" in ok.output and (tmp_path / "output-1.png").read_bytes()[:4] == b"\x89PNG"
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('boom')")
    bad = CliRunner().invoke(cli, ["run", str(script), "--image", "kernel-sandbox:python"])
    assert bad.exit_code == 1 and "ValueError: boom" in bad.output


def test_shell_exits_with_the_command_status(docker_engine) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(
        cli, ["shell", "echo out; exit 3", "--image", "kernel-sandbox:python"]
    )
    assert result.exit_code == 3 and "out" in result.output


def test_gc_removes_sandboxes_whose_owner_was_killed(docker_engine) -> None:  # type: ignore[no-untyped-def]
    maker = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_MAKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert maker.stdout is not None
    sandbox_id = maker.stdout.readline().strip()
    os.kill(maker.pid, signal.SIGKILL)
    maker.wait()
    label = f"kernel-sandbox.id={sandbox_id}"
    assert docker_engine.containers.list(all=True, filters={"label": label})
    listed = CliRunner().invoke(cli, ["ps"])
    assert sandbox_id in listed.output and "(gone)" in listed.output
    result = CliRunner().invoke(cli, ["gc"])
    assert result.exit_code == 0 and f"removing sandbox {sandbox_id}" in result.output
    assert not docker_engine.containers.list(all=True, filters={"label": label})
