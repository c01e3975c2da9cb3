"""``kernel-sandbox attach SANDBOX``: a person's terminal console on a live sandbox's kernel.

The sandbox (an agent's, a server's, a pool member's) is found by its id label and
reached the way a restarted server adopts one (:meth:`AsyncSandbox.adopt`), but as a
*guest*: its owner keeps it, nothing is restarted or removed, and leaving the console
leaves the kernel as it was.  The console is jupyter_console's, on a connection file
written to a private directory (mode 0700) and removed on exit.

What the person runs is recorded in the sandbox's session notebook, when a recorder on
this machine keeps one (or ``--notebook`` names it): each cell with its outputs, marked
``"by": "person"``.  The notebook then has two writers, kept safe by
:mod:`kernel_sandbox.notebook.shared` (a lock, and every write starts from the file).
Ctrl-C during a cell interrupts it (:meth:`AsyncSandbox.interrupt`).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from .._extras import require_extra
from ..config import SandboxConfig
from ..errors import ConfigError
from ..kernel.wellformed import MALFORMED_WARNINGS, malformed, malformed_note
from ..limits import ATTACH_CELL_OUTPUT_BYTES
from ..notebook.cells import META_KEY, iso_time
from ..notebook.shared import append_cells, find_notebook
from ..sandbox import AsyncSandbox

__all__ = ["attach", "recording_shell"]

#: The iopub messages whose content the console shows (checked before it does).
_OUTPUTS = ("stream", "display_data", "execute_result", "update_display_data", "error")


async def _guest(sandbox_id: str, host: str) -> AsyncSandbox:
    return await AsyncSandbox.adopt(sandbox_id, SandboxConfig(), host=host, own=False)


def _write_connection_file(info: dict[str, Any]) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="kernel-sandbox-attach-"))  # mode 0700
    path = directory / "kernel.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    return path


def recording_shell(base: type, notebook: Path | None) -> Any:
    """jupyter_console's shell class, recording each cell of this console into ``notebook``."""

    class RecordingShell(base):  # type: ignore[misc]
        _captured: list[dict[str, Any]] | None = None

        def include_output(self, msg: dict[str, Any]) -> bool:
            kind = msg.get("header", {}).get("msg_type", "")
            problem = malformed(kind, msg.get("content")) if kind in _OUTPUTS else None
            if problem:  # shown as a note; neither the console nor its recording see it
                MALFORMED_WARNINGS.warn(f"the kernel sent a malformed {kind}: {problem}")
                print(malformed_note(kind, problem), end="", file=sys.stderr)
                return False
            if self._captured is not None and self.from_here(msg):
                self._captured.append(msg)
            return bool(super().include_output(msg))

        def run_cell(self, cell: str, store_history: bool = True) -> None:
            if not cell or cell.isspace() or notebook is None:
                super().run_cell(cell, store_history)
                return
            self._captured, started = [], time.time()
            try:
                super().run_cell(cell, store_history)
            finally:
                captured, self._captured = self._captured, None
                _record(notebook, cell, captured, started)

    return RecordingShell


def _record(notebook: Path, code: str, messages: list[dict[str, Any]], started: float) -> None:
    from nbformat.v4 import new_code_cell, output_from_msg

    outputs, count, status, size = [], None, "ok", 0
    for msg in messages:
        kind = msg["header"]["msg_type"]
        if kind == "execute_input":
            count = (
                msg["content"].get("execution_count") if isinstance(msg["content"], dict) else None
            )
            count = count if type(count) is int else None
        elif kind in ("stream", "display_data", "execute_result", "error"):
            if malformed(kind, msg["content"]):
                continue  # the person's cell is kept; the console showed a note
            size += len(json.dumps(msg["content"]))
            if size > ATTACH_CELL_OUTPUT_BYTES:
                continue
            outputs.append(output_from_msg(msg))
            status = "error" if kind == "error" else status
    meta = {
        "kind": "python",
        "by": "person",
        "person": getpass.getuser(),
        "via": "kernel-sandbox attach",
        "status": status,
        "started_at": iso_time(started),
        "duration": round(time.time() - started, 4),
    }
    if size > ATTACH_CELL_OUTPUT_BYTES:
        meta["truncated_bytes"] = size - ATTACH_CELL_OUTPUT_BYTES
    cell = new_code_cell(code, execution_count=count, outputs=outputs, metadata={META_KEY: meta})
    try:
        append_cells(notebook, [cell])
    except (OSError, ValueError) as exc:  # the console goes on; the person is told
        print(f"[kernel-sandbox] could not record this cell in {notebook}: {exc}", file=sys.stderr)


@click.command()
@click.argument("sandbox_id")
@click.option(
    "--notebook",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Record into this notebook (default: the sandbox's session notebook, if known).",
)
@click.option("--host", "host_name", default="docker", show_default=True, help="Kernel host.")
def attach(sandbox_id: str, notebook: Path | None, host_name: str) -> None:
    """Open a console on the live kernel of a running sandbox (its variables, as they are).

    What you run is recorded in the sandbox's session notebook as a person's cells.
    Ctrl-C interrupts a running cell; Ctrl-D (or exit) leaves; the sandbox runs on.
    """
    with require_extra("attach", "kernel-sandbox attach"):
        from jupyter_console.app import ZMQTerminalIPythonApp
        from jupyter_console.ptshell import ZMQTerminalInteractiveShell
    guest = asyncio.run(_guest(sandbox_id, host_name))
    info = dict(guest.connection_info or {})
    asyncio.run(guest.close())  # only the session: a guest removes nothing
    notebook = notebook or find_notebook(sandbox_id)
    if notebook is None:
        click.echo(
            f"note: no session notebook of {sandbox_id} is known on this machine; "
            "what you run is not recorded (pass --notebook to record it)",
            err=True,
        )
    elif not notebook.is_file():
        raise ConfigError(f"no notebook at {notebook}")
    connection = _write_connection_file(info)

    def interrupt() -> None:  # a thread of its own: the console's loop is busy
        threading.Thread(target=asyncio.run, args=(guest.host.interrupt(),)).start()

    shell_class = recording_shell(ZMQTerminalInteractiveShell, notebook)

    class AttachApp(ZMQTerminalIPythonApp):  # type: ignore[misc]
        def init_shell(self) -> None:  # jupyter_console's, with the recording shell
            import signal

            from jupyter_client.consoleapp import JupyterConsoleApp

            JupyterConsoleApp.initialize(self)
            signal.signal(signal.SIGINT, self.handle_sigint)
            self.shell = shell_class.instance(
                parent=self, manager=None, client=self.kernel_client, confirm_exit=False
            )
            self.shell.own_kernel = False

        def handle_sigint(self, *args: Any) -> None:
            if self.shell._executing:
                interrupt()
            else:
                raise KeyboardInterrupt

    click.echo(f"attached to sandbox {sandbox_id} ({guest.image}); Ctrl-D leaves it running")
    try:
        AttachApp.launch_instance(
            argv=["--existing", str(connection), "--ZMQTerminalInteractiveShell.banner="]
        )
    finally:
        connection.unlink(missing_ok=True)
        connection.parent.rmdir()
