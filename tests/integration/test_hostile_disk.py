"""Hostile code against the disk: fillers are stopped at ``disk_limit``, the root is read-only,
and the run directory on the host (``ipc`` transport) takes nothing.

The kernel's own filler runs in python, R and JavaScript (tests/integration/hostile_code.py).
Every filler is capped far above the bound (``ATTEMPT``) so that, were the bound gone, the
test would fail on the numbers instead of filling the machine's disk.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kernel_sandbox.cli.main import cli
from kernel_sandbox.config import LABEL_PREFIX
from kernel_sandbox.errors import FileOperationError, SandboxStartError
from kernel_sandbox.kernel.connection import (
    CONTAINER_RUN_DIR,
    ipc_socket_names,
    new_connection_info,
)
from kernel_sandbox.rundirs import runtime_root
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet
from tests.integration.conftest import (
    GVISOR,
    ORPHAN_MAKER,
    PYTHON_IMAGE,
    orphan_of_killed_owner,
)
from tests.integration.hostile_code import (
    HOSTILE_LANGUAGES,
    PYTHON,
    Hostile,
    require_image,
    sandbox_options,
)

pytestmark = pytest.mark.integration

MiB = 1024**2
DISK_LIMIT = "64m"
#: What each filler tries to write: four times the whole limit.
ATTEMPT = 256 * MiB
#: How much the host's disk may lose while a filler runs (other tests share the machine).
HOST_SLACK = 128 * MiB

# Each writable place: how to name it in code, and its key in SandboxConfig.disk_budget().
PLACES = [("filler", "working_dir"), ("/tmp/filler", "tmp"), ("~/filler", "home")]
PLACES_WITH_SHM = [*PLACES, ("/dev/shm/filler", "shm")]


async def bounded(make_sandbox: Any, lang: Hostile = PYTHON) -> AsyncSandbox:
    options = sandbox_options(lang) if lang is not PYTHON else {"image": PYTHON_IMAGE}
    sandbox: AsyncSandbox = await make_sandbox(**options, disk_limit=DISK_LIMIT)
    return sandbox


def host_free(docker_engine: Any) -> int:
    """Free bytes on the engine's data root (or / when it is not visible from here)."""
    root = docker_engine.info().get("DockerRootDir", "/")
    return shutil.disk_usage(root if os.path.isdir(root) else "/").free


async def size_of(sandbox: AsyncSandbox, path: str) -> int:
    result = await sandbox.run_shell(f"wc -c < {path}")
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


async def assert_space_comes_back(sandbox: AsyncSandbox, path: str, lang: Hostile = PYTHON) -> None:
    """The sandbox's kernel still works, and after deleting the filler its place takes data
    again."""
    alive = await sandbox.run_code(lang.answer)
    assert (alive.status, alive.stdout) == ("ok", "42\n"), alive.text
    removed = await sandbox.run_shell(f"rm -f {path}")
    assert removed.exit_code == 0, removed.stderr
    again = await sandbox.run_shell(f"head -c {4 * MiB} /dev/zero > {path} && wc -c < {path}")
    assert again.exit_code == 0 and int(again.stdout) == 4 * MiB, again.stderr


@pytest.mark.parametrize("lang", HOSTILE_LANGUAGES)
@pytest.mark.parametrize(("path", "place"), PLACES_WITH_SHM)
async def test_disk_filler_is_stopped_at_its_share_of_the_limit(
    make_sandbox: Any, docker_engine: Any, path: str, place: str, lang: Hostile
) -> None:
    """The kernel's own writes (python, R, JavaScript: tests/integration/hostile_code.py)."""
    require_image(lang)
    sandbox = await bounded(make_sandbox, lang)
    share = sandbox.config.disk_budget()[place]
    free_before = host_free(docker_engine)
    filler = lang.code(lang.disk_filler, path=path, attempt=ATTEMPT)
    ex = await sandbox.run_code(filler, timeout=120)
    free_after = host_free(docker_engine)
    assert ex.status == "ok", ex.text
    written, refusal = ex.stdout.split()
    print(
        f"{lang.language} {place}: wrote {written} B of a {share} B share; "
        f"host lost {free_before - free_after} B"
    )
    assert free_before - free_after < HOST_SLACK
    assert refusal == lang.disk_refusal
    assert share - 2 * MiB <= int(written) <= share
    await assert_space_comes_back(sandbox, path.replace("~", "$HOME"), lang)


@pytest.mark.parametrize(
    "command",
    [
        f"dd if=/dev/zero of={{path}} bs=1M count={ATTEMPT // MiB}",
        f"yes | head -c {ATTEMPT} > {{path}}",
    ],
    ids=["dd", "yes"],
)
@pytest.mark.parametrize(("path", "place"), PLACES)
async def test_shell_disk_filler_is_stopped_at_its_share_of_the_limit(
    make_sandbox: Any, docker_engine: Any, command: str, path: str, place: str
) -> None:
    sandbox = await bounded(make_sandbox)
    share = sandbox.config.disk_budget()[place]
    path = path.replace("~", "$HOME")
    free_before = host_free(docker_engine)
    result = await sandbox.run_shell(command.format(path=path), timeout=120)
    free_after = host_free(docker_engine)
    written = await size_of(sandbox, path)
    print(
        f"{place}: wrote {written} B of a {share} B share; host lost {free_before - free_after} B"
    )
    assert free_before - free_after < HOST_SLACK
    assert result.exit_code != 0 and "No space left on device" in result.stderr
    assert share - 2 * MiB <= written <= share
    await assert_space_comes_back(sandbox, path)


async def test_file_write_past_the_limit_is_a_clear_error_and_leaves_nothing(
    make_sandbox: Any,
) -> None:
    sandbox = await bounded(make_sandbox)
    too_big = sandbox.config.disk_budget()["working_dir"] + MiB
    with pytest.raises(FileOperationError, match="writable area is full") as caught:
        await sandbox.files.write("big.bin", b"x" * too_big)
    assert f"disk_limit (now '{DISK_LIMIT}'" in str(caught.value)
    assert not await sandbox.files.exists("big.bin")  # no truncated leftover
    tools = ToolSet(sandbox)
    call = {"operation": "write", "file_path": "/tmp/big.txt", "content": "x" * too_big}
    result = await tools.execute("file_operation", call)
    assert result.status == "error" and result.error is not None
    assert "writable area is full" in result.error and "disk_limit" in result.error
    assert not await sandbox.files.exists("/tmp/big.txt")
    await sandbox.files.write("small.txt", "still works")  # the space is all there
    assert await sandbox.files.read_text("small.txt") == "still works"


OUTSIDE = ["/usr/lib/x", "/etc/passwd", "/opt/venv/x", "/x", "/var/tmp/x"]

PYTHON_OUTSIDE = f"""
import json
codes = {{}}
for path in {OUTSIDE!r}:
    try:
        open(path, "a").write("owned")
        codes[path] = 0
    except OSError as exc:
        codes[path] = exc.errno
print(json.dumps(codes))
"""


async def test_writes_outside_the_writable_area_fail_and_leave_the_image_unchanged(
    make_sandbox: Any, docker_engine: Any
) -> None:
    sandbox = await bounded(make_sandbox)
    layer_before = root_layer_changes(docker_engine, sandbox)
    refused = {errno.EROFS, errno.EACCES}
    ex = await sandbox.run_python(PYTHON_OUTSIDE)
    assert ex.status == "ok", ex.text
    codes = json.loads(ex.stdout)
    assert set(codes.values()) <= refused, codes
    assert codes["/var/tmp/x"] == errno.EROFS  # world-writable in the image: only the
    if GVISOR:  # read-only root stops it; gVisor checks permissions first for "/"
        mounts = await sandbox.run_shell("grep ' / ' /proc/mounts")
        assert " ro," in mounts.stdout, mounts
        assert codes["/x"] == errno.EACCES
    else:
        assert codes["/x"] == errno.EROFS  # read-only root stops these two
    for path in OUTSIDE:
        shell = await sandbox.run_shell(f"echo owned >> {path}")
        assert shell.exit_code != 0
        assert "Read-only file system" in shell.stderr or "Permission denied" in shell.stderr
        with pytest.raises(FileOperationError, match=r"Read-only file system|Permission denied"):
            await sandbox.files.write(path, "owned")
    tool = await ToolSet(sandbox).execute(
        "file_operation", {"operation": "write", "file_path": "/usr/lib/x", "content": "owned"}
    )
    # gVisor checks the permission of a root-owned directory before the read-only mount
    refusal = "Permission denied" if GVISOR else "Read-only file system"
    assert tool.status == "error" and refusal in (tool.error or ""), tool
    assert root_layer_changes(docker_engine, sandbox) == layer_before


def root_layer_changes(docker_engine: Any, sandbox: AsyncSandbox) -> list[tuple[str, int]]:
    """What the container changed in its image (the engine's mount points, at least)."""
    changes = docker_engine.api.diff(sandbox.container_id) or []
    return sorted((c["Path"], c["Kind"]) for c in changes)


async def test_kernel_starts_cleanly_and_plots_with_a_read_only_root(make_sandbox: Any) -> None:
    sandbox = await make_sandbox(disk_limit=DISK_LIMIT)  # datascience image: matplotlib
    ex = await sandbox.run_python(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
        "import IPython; print(IPython.paths.get_ipython_dir())"
    )
    assert ex.status == "ok", ex.text
    assert len(ex.images("image/png")) == 1
    assert ex.stderr == ""  # matplotlib warns here when its cache dir is not writable
    assert sandbox.container_id is not None
    log = await sandbox.host.logs(tail=200)
    assert not [line for line in log.splitlines() if "warn" in line.lower() or "rror" in line]


def sandbox_volumes(docker_engine: Any, sandbox_id: str) -> list[dict[str, Any]]:
    found = docker_engine.api.volumes(filters={"label": f"{LABEL_PREFIX}.id={sandbox_id}"})
    return list(found.get("Volumes") or [])


async def test_volumes_carry_the_sandbox_labels_and_go_on_close(
    make_sandbox: Any, docker_engine: Any
) -> None:
    sandbox = await bounded(make_sandbox)
    volumes = sandbox_volumes(docker_engine, sandbox.id)
    assert len(volumes) == 3
    for volume in volumes:
        assert volume["Labels"][f"{LABEL_PREFIX}.owner-pid"] == str(os.getpid())
        assert volume["Options"]["type"] == "tmpfs"
    await sandbox.close()
    assert sandbox_volumes(docker_engine, sandbox.id) == []


@pytest.mark.orphans  # gc
def test_gc_removes_the_volumes_of_a_killed_owner(docker_engine: Any) -> None:
    sandbox_id = orphan_of_killed_owner()
    assert len(sandbox_volumes(docker_engine, sandbox_id)) == 3
    result = CliRunner().invoke(cli, ["gc"])
    assert result.exit_code == 0, result.output
    assert sandbox_volumes(docker_engine, sandbox_id) == []


def test_volumes_go_at_interpreter_exit_when_the_sandbox_was_not_closed(
    docker_engine: Any,
) -> None:
    script = ORPHAN_MAKER.replace("sys.stdin.read()  # wait to be killed", "")
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=120,
        check=True,
    )
    assert sandbox_volumes(docker_engine, done.stdout.strip()) == []


async def test_places_that_coincide_share_one_volume_with_both_shares(
    make_sandbox: Any, docker_engine: Any
) -> None:
    sandbox = await make_sandbox(image=PYTHON_IMAGE, disk_limit=DISK_LIMIT, working_dir="/tmp")
    budget = sandbox.config.disk_budget()
    assert len(sandbox_volumes(docker_engine, sandbox.id)) == 2
    size = await sandbox.run_shell("df -B1 --output=size /tmp | tail -1")
    assert int(size.stdout) == budget["working_dir"] + budget["tmp"]


async def test_a_user_the_image_does_not_have_is_a_start_error(make_sandbox: Any) -> None:
    with pytest.raises(SandboxStartError, match="user 'nobody-here' does not exist in image"):
        await make_sandbox(image=PYTHON_IMAGE, user="nobody-here")


# -- the host run directory (ipc transport) --------------------------------------------

RUN_DIR_WRITES = """
import errno, json, os
codes = {}
for name in ("new-file", "status.new", "go-1", "k-9"):
    try:
        with open("/run/kernel-sandbox/" + name, "w") as f:
            f.write("x" * 1000)
        codes[name] = 0
    except OSError as exc:
        codes[name] = exc.errno
try:
    os.mkdir("/run/kernel-sandbox/d")
    codes["mkdir"] = 0
except OSError as exc:
    codes["mkdir"] = exc.errno
print(json.dumps(codes))
"""


def host_entries(sandbox: AsyncSandbox) -> set[str]:
    """What the sandbox's run directory on the host holds (only the host's files, sealed)."""
    return set(os.listdir(runtime_root() / sandbox.id))


def expected_entries(sandbox: AsyncSandbox) -> set[str]:
    # ipc sockets are named by the fixed "ports" of every ipc connection: k-1 ... k-5
    sockets = ipc_socket_names(new_connection_info("ipc", f"{CONTAINER_RUN_DIR}/k"))
    return {*sockets, ".owner", "status"}


async def assert_run_dir_refuses_writes(sandbox: AsyncSandbox) -> None:
    """From Python and from the shell, nothing can be created in /run/kernel-sandbox."""
    ex = await sandbox.run_python(RUN_DIR_WRITES)
    assert ex.status == "ok", ex.text
    codes = json.loads(ex.stdout)
    assert codes == dict.fromkeys(codes, errno.EACCES), codes
    shell = await sandbox.run_shell(
        "echo owned > /run/kernel-sandbox/new-file; "
        "head -c 8388608 /dev/zero > /run/kernel-sandbox/big; mkdir /run/kernel-sandbox/d"
    )
    assert shell.exit_code != 0
    assert shell.stderr.count("Permission denied") == 3, shell.stderr
    assert host_entries(sandbox) == expected_entries(sandbox)


async def test_run_dir_refuses_writes_after_start_and_every_kind_of_restart(
    make_sandbox: Any,
) -> None:
    sandbox: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE)
    await assert_run_dir_refuses_writes(sandbox)
    await sandbox.restart()  # in place
    await assert_run_dir_refuses_writes(sandbox)
    crash = await sandbox.run_python("import os; os._exit(3)")
    assert crash.status == "kernel_died" and "container" not in crash.message, crash.message
    await assert_run_dir_refuses_writes(sandbox)
    # A killed supervisor stops the container: the fallback restarts all of it.
    fallback = await sandbox.run_python(
        "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)"
    )
    assert "container was restarted" in fallback.message, fallback.message
    await assert_run_dir_refuses_writes(sandbox)


# A writer outside the kernel's process group (it survives kernel restarts) that tries,
# every few ms, to leave a file and a directory in the run directory, or to open a file
# there and keep it (deleted, its data would stay on the host's disk while it is open).
WINDOW_WRITER = (
    "setsid sh -c 'i=0; while [ $i -lt 20000 ]; do echo $i > /tmp/n && mv /tmp/n /tmp/tries; "
    "echo x > /run/kernel-sandbox/junk-$i 2>/dev/null && echo $i >> /tmp/got-in; "
    "mkdir /run/kernel-sandbox/dir-$i 2>/dev/null && echo $i >> /tmp/got-in; "
    "(exec 3>/run/kernel-sandbox/held-$i && rm /run/kernel-sandbox/held-$i "
    "&& echo $i >> /tmp/got-in && sleep 1000) 2>/dev/null & "
    "i=$((i + 1)); sleep 0.002; done' >/dev/null 2>&1 </dev/null &"
)


async def test_kernel_restarts_never_open_the_run_directory(make_sandbox: Any) -> None:
    """Every kernel listens on the sockets bound once per container: nothing to reopen."""
    sandbox: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE)
    started = await sandbox.run_shell(WINDOW_WRITER)
    assert started.exit_code == 0, started.stderr
    tries = []
    for _ in range(10):  # crash restarts end only the kernel's processes, not the writer
        crash = await sandbox.run_python("import os; os._exit(1)")
        assert "restarted" in crash.message and "container" not in crash.message, crash.message
        tries.append((await sandbox.run_shell("cat /tmp/tries")).stdout.strip())
    got_in = (await sandbox.run_shell("cat /tmp/got-in 2>/dev/null | wc -l")).stdout.strip()
    print(f"the writer tried {tries[-1]} times over 10 restarts and got in {got_in} times")
    assert got_in == "0"
    assert len(set(tries)) == len(tries)  # it was trying all along
    assert host_entries(sandbox) == expected_entries(sandbox)
    # An explicit restart ends every process of the sandbox, the writer included.
    writers = "grep -l 'junk-[$]i' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"  # not itself
    assert int((await sandbox.run_shell(writers)).stdout) > 0
    await sandbox.restart()
    assert int((await sandbox.run_shell(writers)).stdout) == 0
    assert (await sandbox.run_python("6 * 7")).text == "42"


STATUS_FLOOD = """
import os, threading
path = "/run/kernel-sandbox/status"
fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
stored = 0
try:
    while stored < 10 * 1024 * 1024:
        stored += os.write(fd, b"y" * 4096)
except BlockingIOError:
    pass
os.close(fd)
print(stored)

def flood():  # blocking writes: each waits until the host has read the last
    with open(path, "wb") as f:
        for _ in range(160):
            f.write(b"z" * 65536)

threading.Thread(target=flood, daemon=True).start()
"""


async def test_the_status_channel_stores_nothing_on_the_host(make_sandbox: Any) -> None:
    sandbox: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE)
    ex = await sandbox.run_python(STATUS_FLOOD)
    assert ex.status == "ok", ex.text
    stored = int(ex.stdout)
    status = os.stat(runtime_root() / sandbox.id / "status")
    print(f"10 MiB offered to the status channel: {stored} B taken (a pipe buffer)")
    assert stored <= MiB  # a pipe's buffer (64 KiB; at most 1 MiB if enlarged)
    assert stat.S_ISFIFO(status.st_mode) and status.st_size == 0
    for _ in range(3):  # the flood goes on in the kernel: the sandbox still works
        assert (await sandbox.run_python("6 * 7")).text == "42"
    crash = await sandbox.run_python("import os; os._exit(5)")
    assert crash.status == "kernel_died", crash.message  # the report got through the junk
    assert "exited with code 5" in crash.message and "container" not in crash.message
    assert (await sandbox.run_python("6 * 7")).text == "42"
    assert host_entries(sandbox) == expected_entries(sandbox)
