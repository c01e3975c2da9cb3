"""Sandboxed kernels driven by unmodified Jupyter clients.

The kernelspec comes from ``kernel-sandbox kernelspec install`` (the real command), and
jupyter_client's ``KernelManager``, nbclient and ``jupyter nbconvert --execute`` start it
through the ``kernel-sandbox`` provisioner found by its entry point: a real container,
a real kernel, the real Jupyter protocol for execute, interrupt, restart and shutdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from kernel_sandbox.backends.docker import docker_client
from kernel_sandbox.backends.docker.images import builder
from tests.conftest import require
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LABEL = "kernel-sandbox.test-jupyter"
#: The kernelspec `kernel-sandbox kernelspec install --kernel ir` makes here.
R_KERNEL = "ks-test-ir"


def _docker_ids(value: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL}={value}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def _entry_point_dir(tmp: Path) -> str | None:
    """A dist-info naming the provisioner, when the installed metadata predates it
    (a worktree run against an older editable install); CI installs the project."""
    from importlib.metadata import entry_points

    if list(entry_points(group="jupyter_client.kernel_provisioners", name="kernel-sandbox")):
        return None
    info = tmp / "kernel_sandbox_provisioner-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ks-provisioner\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[jupyter_client.kernel_provisioners]\n"
        "kernel-sandbox = kernel_sandbox.jupyter.provisioner:SandboxProvisioner\n"
    )
    return str(tmp)


@pytest.fixture(scope="module")
def kernel(docker_engine, tmp_path_factory) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """Install a kernelspec with the CLI; yield its name and the env to use it."""
    tmp = tmp_path_factory.mktemp("jupyter")
    value = f"{os.getpid()}-{time.monotonic_ns()}"
    name = "ks-test-kernel"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), _entry_point_dir(tmp / "ep"), env.get("PYTHONPATH")) if p
    )
    env["JUPYTER_PATH"] = str(tmp / "share" / "jupyter")
    env["JUPYTER_DATA_DIR"] = str(tmp / "data")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")
    for spec_name, options in (
        (name, ["--image", "kernel-sandbox:python"]),
        (R_KERNEL, ["--kernel", "ir"]),  # its image: kernel-sandbox:r
        ("ks-test-deno", ["--kernel", "deno"]),  # kernel-sandbox:javascript
        ("ks-test-bash", ["--kernel", "bash"]),  # kernel-sandbox:polyglot
    ):
        subprocess.run(
            [sys.executable, "-m", "kernel_sandbox.cli.main", "kernelspec", "install",
             "--name", spec_name, *options, "--prefix", str(tmp)],
            env=env, check=True, cwd=tmp,
        )  # fmt: skip
        spec_file = tmp / "share" / "jupyter" / "kernels" / spec_name / "kernel.json"
        spec = json.loads(spec_file.read_text())
        assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "kernel-sandbox"
        assert spec["interrupt_mode"] == "signal"
        # label what the tests create, so the fixture can prove it is all gone
        spec["metadata"]["kernel_provisioner"]["config"]["sandbox"]["labels"] = {LABEL: value}
        spec_file.write_text(json.dumps(spec))
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "JUPYTER_PATH", "JUPYTER_DATA_DIR")}
    os.environ.update({k: env[k] for k in saved})
    extra = [p for p in env["PYTHONPATH"].split(os.pathsep)[:2] if p not in sys.path]
    sys.path[:0] = extra  # the entry point, for this process's KernelManager too
    try:
        yield {"name": name, "label": value, **{f"env:{k}": v for k, v in env.items()}}
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        left = _docker_ids(value)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        assert not left, f"containers left behind: {left}"


def _env(kernel: dict[str, str]) -> dict[str, str]:
    return {k[4:]: v for k, v in kernel.items() if k.startswith("env:")}


def _run(kc, code: str) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    """Execute through a plain BlockingKernelClient; stdout text and the reply."""
    out: list[str] = []

    def hook(msg):  # type: ignore[no-untyped-def]
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(msg["content"]["ename"])

    reply = kc.execute_interactive(code, timeout=60, output_hook=hook)
    return "".join(out), reply["content"]


def test_kernel_manager_lifecycle(kernel: dict[str, str]) -> None:
    km = KernelManager(kernel_name=kernel["name"])
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(60)
        assert len(_docker_ids(kernel["label"])) == 1
        out, _ = _run(
            kc, "import os; x = 41; open('kept.txt', 'w').write('kept'); print(os.getuid())"
        )
        assert int(out) != 0  # not root

        # interrupt a long cell through the Jupyter protocol (interrupt_mode: signal)
        msg_id = kc.execute("import time; print('started', flush=True); time.sleep(300)")

        def started() -> bool:
            msg = kc.get_iopub_msg(timeout=60)
            return msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream"

        wait_for(started, 60, 0, "the long cell to start")
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        out, _ = _run(kc, "print(x + 1)")
        assert out.strip() == "42"  # the kernel kept its state

        # restart: a fresh kernel (no variables) in the same sandbox (its files kept)
        km.restart_kernel()
        kc.wait_for_ready(60)
        out, _ = _run(kc, "print('x' in dir(), open('kept.txt').read())")
        assert out.strip() == "False kept"
        assert km.is_alive()
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    assert not km.is_alive()
    assert _docker_ids(kernel["label"]) == []  # shutdown removed the sandbox


def test_nbclient_runs_a_notebook(kernel: dict[str, str]) -> None:
    nb = new_notebook(
        cells=[
            new_code_cell("import os, sys\nvalues = [1, 2, 3]\nprint(sum(values))"),
            new_code_cell(
                "from IPython.display import HTML, Image, display\n"
                "import base64, zlib, struct\n"
                "def png(w, h):\n"
                "    raw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * w for _ in range(h))\n"
                "    def chunk(t, d):\n"
                "        c = struct.pack('>I', len(d)) + t + d\n"
                "        return c + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)\n"
                "    ihdr = struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)\n"
                "    return (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', ihdr)\n"
                "            + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))\n"
                "display(Image(png(4, 3)))\n"
                "HTML('<b>rich</b>')"
            ),
            new_code_cell("values.append(4)\nimport time\ntime.sleep(300)"),
            new_code_cell("print(values)"),
        ],
        metadata={
            "kernelspec": {"name": kernel["name"], "display_name": "x", "language": "python"}
        },
    )
    client = NotebookClient(
        nb, timeout=20, interrupt_on_timeout=True, kernel_name=kernel["name"], allow_errors=True
    )
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        out = nb.cells[0].outputs[0]
        assert out.output_type == "stream" and out.text.strip() == "6"
        kinds = [o.output_type for o in nb.cells[1].outputs]
        assert kinds == ["display_data", "execute_result"]
        assert nb.cells[1].outputs[0].data["image/png"]  # base64 PNG, as Jupyter sends it
        assert nb.cells[1].outputs[1].data["text/html"] == "<b>rich</b>"
        assert nb.cells[2].outputs[-1].ename == "KeyboardInterrupt"  # interrupted on timeout
        assert nb.cells[3].outputs[0].text.strip() == "[1, 2, 3, 4]"  # state survived it

        assert client.km is not None
        run_sync(client.km.restart_kernel)()  # nbclient's manager is the async one
        run_sync(client.kc.wait_for_ready)(60)  # type: ignore[union-attr]
        probe = new_code_cell("print('values' in dir())")
        nb.cells.append(probe)
        client.execute_cell(probe, len(nb.cells) - 1)
        assert probe.outputs[0].text.strip() == "False"
    assert _docker_ids(kernel["label"]) == []


@contextlib.contextmanager
def _executed(
    kernel_name: str, language: str, cells: list[str], timeout: float
) -> Iterator[tuple[NotebookClient, Any]]:
    """nbclient runs ``cells`` on ``kernel_name`` (interrupting each at ``timeout``),
    whose kernel says it speaks ``language``; the client, its kernel still up, and the
    executed notebook."""
    meta = {"kernelspec": {"name": kernel_name, "display_name": "x", "language": language}}
    nb = new_notebook(cells=[new_code_cell(code) for code in cells], metadata=meta)
    client = NotebookClient(
        nb, timeout=timeout, interrupt_on_timeout=True, kernel_name=kernel_name, allow_errors=True
    )
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        info = client.wait_for_reply(client.kc.kernel_info())  # type: ignore[union-attr]
        assert info["content"]["language_info"]["name"] == language
        yield client, nb


def test_nbclient_runs_an_r_notebook_with_the_sandboxed_ir_kernel(kernel: dict[str, str]) -> None:
    present = builder.image_exists(docker_client(), "kernel-sandbox:r") is not None
    require(present, "kernel-sandbox:r is not built (kernel-sandbox images build r)")
    cells = [
        "values <- c(1, 2, 3)\ncat(sum(values), '\\n')",
        "library(ggplot2)\nggplot(data.frame(a = 1:3, b = c(2, 4, 8)), aes(a, b)) + geom_point()",
        "values <- c(values, 4)\nrepeat {}",
        "print(values)",
        'stop("boom")',
    ]
    with _executed(R_KERNEL, "R", cells, timeout=20) as (client, nb):  # IRkernel, sandboxed
        out = nb.cells[0].outputs[0]
        assert out.output_type == "stream" and out.text.strip() == "6"
        assert any("image/png" in o.get("data", {}) for o in nb.cells[1].outputs)
        assert nb.cells[3].outputs[0].text.strip() == "[1] 1 2 3 4"  # kept past the interrupt
        error = nb.cells[4].outputs[-1]
        assert error.output_type == "error" and "boom" in error.evalue

        assert client.km is not None
        run_sync(client.km.restart_kernel)()
        run_sync(client.kc.wait_for_ready)(60)  # type: ignore[union-attr]
        probe = new_code_cell('cat(exists("values"), "\\n")')
        nb.cells.append(probe)
        client.execute_cell(probe, len(nb.cells) - 1)
        assert probe.outputs[0].text.strip() == "FALSE"
    assert _docker_ids(kernel["label"]) == []


@pytest.mark.parametrize(
    ("name", "image", "language", "cells", "expected"),
    [
        pytest.param(
            "ks-test-deno",
            "kernel-sandbox:javascript",
            "typescript",
            ["var x = 41", "while (true) {}", "x + 1"],
            "42",
            id="deno",
        ),
        pytest.param(
            "ks-test-bash",
            "kernel-sandbox:polyglot",
            "bash",
            ["x=41", "while true; do :; done", "echo $((x + 1))"],
            "42",
            id="bash",
        ),
    ],
)
def test_nbclient_interrupts_the_sandboxed_javascript_and_bash_kernels(
    kernel: dict[str, str],
    name: str,
    image: str,
    language: str,
    cells: list[str],
    expected: str,
) -> None:
    """Deno wants its interrupts as messages, bash_kernel as signals: nbclient's
    timeout interrupt (a signal, as the kernelspec says) reaches each the way it wants,
    and the state is kept."""
    present = builder.image_exists(docker_client(), image) is not None
    require(present, f"{image} is not built (kernel-sandbox images build)")
    with _executed(name, language, cells, timeout=15) as (_, nb):
        pass
    last = nb.cells[2].outputs[-1]
    text = last.get("text") or last.get("data", {}).get("text/plain", "")
    assert text.strip() == expected, nb.cells[2].outputs
    assert _docker_ids(kernel["label"]) == []


def test_nbconvert_execute_cli(kernel: dict[str, str], tmp_path: Path) -> None:
    nb = new_notebook(
        cells=[
            new_code_cell("import os\nsecret = 'state kept'\nprint('uid', os.getuid())"),
            new_code_cell(
                "import socket\n"
                "try:\n"
                "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
                "    print('network: open')\n"
                "except OSError as exc:\n"
                "    print('network: none', type(exc).__name__)"
            ),
            new_code_cell("print(secret)"),
            new_code_cell("print(open('beside.txt').read())"),
        ]
    )
    source = tmp_path / "in.ipynb"
    nbformat.write(nb, source)
    (tmp_path / "beside.txt").write_text("read beside the notebook")
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         f"--ExecutePreprocessor.kernel_name={kernel['name']}", "--output", "out.ipynb",
         str(source)],
        env=_env(kernel), check=True, cwd=tmp_path, timeout=240,
    )  # fmt: skip
    done = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    texts = [cell.outputs[0].text.strip() for cell in done.cells]
    uid = int(texts[0].split()[1])
    assert uid != 0
    assert texts[1].startswith("network: none")
    assert texts[2] == "state kept"
    assert texts[3] == "read beside the notebook"  # the kernel works in a copy of its folder
    assert _docker_ids(kernel["label"]) == []


def _start(kernel: dict[str, str], name: str, folder: Path, **kwargs):  # type: ignore[no-untyped-def]
    km = KernelManager(kernel_name=name)
    km.start_kernel(cwd=str(folder), **kwargs)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(60)
    return km, kc


def _history(kc, **request) -> list:  # type: ignore[no-untyped-def]
    msg_id = kc.history(output=False, raw=True, **request)
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    return [entry[2] for entry in reply["content"]["history"]]


def test_the_clients_arguments_env_and_folder_reach_the_kernel(
    kernel: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "nb"
    folder.mkdir()
    (folder / "data.txt").write_text("beside")
    (tmp_path / "secret.txt").write_text("host secret")
    (folder / "link").symlink_to(tmp_path / "secret.txt")
    monkeypatch.setenv("KS_TEST_HOST_SECRET", "must not leak")
    env = {**os.environ, "KS_TEST_WISH": "granted", "LD_PRELOAD": "/host/evil.so"}
    args = ["--HistoryManager.hist_file=:memory:", "--InlineBackend.figure_format=svg", "--ip=1"]
    km, kc = _start(kernel, kernel["name"], folder, extra_arguments=args, env=env)
    try:
        out, _ = _run(
            kc,
            "import os\n"
            "from IPython.core.getipython import get_ipython\n"
            "cfg = get_ipython().config\n"
            "print(open('data.txt').read(), os.path.islink('link'), os.path.exists('link'))\n"
            "print(cfg.InlineBackend.figure_format, os.environ.get('KS_TEST_WISH'),\n"
            "      os.environ.get('LD_PRELOAD'), os.environ.get('KS_TEST_HOST_SECRET'))",
        )
        # the copy holds the link, not what it points at on the host (absent in here)
        assert out.split("\n")[:2] == ["beside True False", "svg granted None None"]
        _run(kc, "first = 1")
        _run(kc, "second = 2")
        assert _history(kc, hist_access_type="tail", n=2) == ["first = 1", "second = 2"]
        assert _history(kc, hist_access_type="search", pattern="sec*") == ["second = 2"]
        _run(kc, "open('made.txt', 'w').write('x')")
        assert not (folder / "made.txt").exists()  # writes stay in the sandbox
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def test_cwd_mode_mount_is_a_read_only_view(kernel: dict[str, str], tmp_path: Path) -> None:
    spec_dir = Path(os.environ["JUPYTER_PATH"]) / "kernels"
    spec = json.loads((spec_dir / kernel["name"] / "kernel.json").read_text())
    spec["metadata"]["kernel_provisioner"]["config"]["cwd_mode"] = "mount"
    (spec_dir / "ks-test-mount").mkdir(exist_ok=True)
    (spec_dir / "ks-test-mount" / "kernel.json").write_text(json.dumps(spec))
    folder = tmp_path / "nb"
    folder.mkdir()
    (folder / "data.txt").write_text("v1")
    km, kc = _start(kernel, "ks-test-mount", folder)
    try:
        (folder / "data.txt").write_text("v2")  # a live view, not a copy
        out, _ = _run(
            kc,
            "print(open('data.txt').read())\n"
            "try:\n    open('new.txt', 'w')\nexcept OSError as exc:\n    print(exc.errno)",
        )
        assert out.split() == ["v2", "30"]  # EROFS
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    assert not (folder / "new.txt").exists()
