"""The first programs a newcomer runs: the README's example and the getting-started page's.

Each runs as a user would run it, in a separate Python process; whatever sandbox it
leaves behind (it should leave none) is removed by its owner pid and fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import docker
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def python_block(page: Path, needle: str) -> str:
    """The one ```python block of ``page`` that contains ``needle``."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"{page.name} should show one example with {needle!r}"
    return found[0]


def run_program(code: str, tmp_path: Path, engine: docker.DockerClient) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = engine.containers.list(
            all=True, filters={"label": f"kernel-sandbox.owner-pid={proc.pid}"}
        )
        for container in left:
            container.remove(force=True)
    assert not left, "the example left its sandbox behind"
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


def test_the_readme_example_runs(docker_engine: docker.DockerClient, tmp_path: Path) -> None:
    code = python_block(ROOT / "README.md", "AsyncSandbox.create(")
    out = run_program(code, tmp_path, docker_engine)
    assert out.startswith("ok ") and "\nmean " in out  # df.describe() as text
    assert "\ntotal " in out  # the `ls -la`


def test_the_getting_started_example_runs(
    docker_engine: docker.DockerClient, tmp_path: Path
) -> None:
    code = python_block(ROOT / "docs" / "getting-started.md", "AsyncSandbox.create(")
    out = run_program(code, tmp_path, docker_engine)
    assert out.startswith("ok ") and "\nmean " in out
    assert "in.csv" in out  # files.list("data") after the write
