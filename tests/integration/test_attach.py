"""``kernel-sandbox attach``: a person's console on the live kernel of another process's
sandbox, driven through a real terminal (pexpect), recorded in the owner's notebook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from kernel_sandbox.notebook.cells import META_KEY

pytestmark = pytest.mark.usefixtures("docker_engine")

ROOT = Path(__file__).parents[2]

#: The owner: a recorded sandbox that runs each line it reads, and prints the result.
OWNER = """
import asyncio, sys
from kernel_sandbox import AsyncSandbox
from kernel_sandbox.notebook import NotebookRecorder

async def main():
    sb = await AsyncSandbox.create(image="kernel-sandbox:python",
                                   labels={"kernel-sandbox.test": "1"})
    NotebookRecorder.attach(sb, sys.argv[1], title="owner")
    await sb.run_python("x = 41")
    print(sb.id, flush=True)
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        print("OWNER:", (await sb.run_python(line)).text.strip(), flush=True)
    await sb.close()

asyncio.run(main())
"""

PROMPT = r"In \[.*?\]: "


def test_person_attaches_sets_a_variable_and_is_recorded(tmp_path: Path) -> None:
    notebook = tmp_path / "session.ipynb"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(notebook)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert owner.stdin is not None and owner.stdout is not None
    try:
        sandbox_id = owner.stdout.readline().strip()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
        console = pexpect.spawn(
            sys.executable,
            ["-m", "kernel_sandbox.cli.main", "attach", sandbox_id],
            encoding="utf-8",
            timeout=120,
            env=env,
            cwd=str(ROOT),
            dimensions=(40, 200),
        )
        console.expect(f"attached to sandbox {sandbox_id}")
        console.expect(PROMPT)
        console.sendline("y = x + 1; print('from the person', y)")  # the owner's x
        console.expect("from the person 42")
        console.expect(PROMPT)
        console.sendeof()  # leave; the sandbox runs on
        console.expect(pexpect.EOF)
        console.close()

        owner.stdin.write("y * 2\n")  # the owner sees what the person set
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "OWNER: 84"
    finally:
        owner.stdin.write("\n")
        owner.stdin.flush()
        owner.wait(timeout=120)

    cells = json.loads(notebook.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    at = sources.index("y = x + 1; print('from the person', y)")
    person = cells[at]
    meta = person["metadata"][META_KEY]
    assert meta["by"] == "person" and meta["via"] == "kernel-sandbox attach"
    assert "from the person 42" in "".join(person["outputs"][0]["text"])
    # one notebook, both writers: the owner's cells before and after the person's stay
    assert sources.index("x = 41") < at < sources.index("y * 2")
    import nbformat

    nbformat.validate(nbformat.reads(notebook.read_text(), as_version=4))
