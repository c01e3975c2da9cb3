"""The ipc binder, run with the host's Python and sh (no daemon)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from kernel_sandbox.kernel.connection import ipc_socket_names, launch_command, new_connection_info

# Stands in for the supervisor: says which descriptors it got and what they are.
REPORT = """echo "${KERNEL_SANDBOX_SOCKETS-gone}"
echo "$KERNEL_SANDBOX_FDS"
for fd in $(echo "$KERNEL_SANDBOX_FDS" | tr , '\\n' | sed 's/.*=//'); do
    readlink /proc/$$/fd/$fd
done"""


def test_binder_binds_the_sockets_once_and_hands_the_listeners_down(tmp_path: Path) -> None:
    info = new_connection_info("ipc", str(tmp_path / "k"))
    # the container's command up to the supervisor, which REPORT stands in for
    command, env = launch_command(sys.executable, info, str(tmp_path / "state"))
    binder = command[: command.index("-c", command.index("-c") + 1)]
    done = subprocess.run(
        [*binder, "-c", REPORT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    gone, handed, *targets = done.stdout.split()
    assert gone == "gone"  # the paths are not left to the kernel's environment
    pairs = dict(item.rsplit("=", 1) for item in handed.split(","))
    assert set(pairs) == {f"ipc://{tmp_path}/{name}" for name in ipc_socket_names(info)}
    # still open in the shell the binder became
    assert len(targets) == 5 and all(t.startswith("socket:") for t in targets)
    for name in ipc_socket_names(info):
        mode = (tmp_path / name).stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o777  # any host user connects
