"""The command line starts without building grammars it never uses."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_process_validates_notebooks_without_rfc3987_syntax() -> None:
    """jsonschema imports rfc3987_syntax when present (3-4 s of grammar building per
    start); the CLI's process does without it and still validates notebooks."""
    code = (
        "import sys, kernel_sandbox.cli.main, nbformat\n"
        "nbformat.validate(nbformat.v4.new_notebook())\n"
        "assert sys.modules.get('rfc3987_syntax') is None, 'rfc3987_syntax was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
