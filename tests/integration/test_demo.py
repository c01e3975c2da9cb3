"""The README's main job: ``kernel-sandbox demo`` works without an API key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def test_demo_without_api_key_replays_the_example_session(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli.main", "demo", "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "counter * 2 -> 42" in done.stdout
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
    replayed = nbformat.read(tmp_path / "example-analysis.replayed.ipynb", as_version=4)
    nbformat.validate(replayed)
    pngs = [
        o
        for c in replayed.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(pngs) == 1
    html = (tmp_path / "example-analysis.replayed.html").read_text()
    assert "data:image/png;base64," in html
