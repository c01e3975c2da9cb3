"""Hostile sandboxes against the host's operations on paths they control (issue 10, 4-9).

Every case runs under the default ``ipc`` transport and under ``tcp``.  The host's
memory (this process: resident and peak) and disk (the run directory, a host directory
mounted into the sandbox) are measured around each attack and must stay within a
stated bound; a canary unix socket on the host records every connection, and none may
come; nothing on the host may become writable by the sandbox user; and the file API
may do only what the sandbox user may do.  Each figure is printed as ``[host-paths]``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import zmq

from kernel_sandbox.errors import FileOperationError, KernelError, SandboxFileNotFoundError
from kernel_sandbox.kernel.client import KernelSession
from kernel_sandbox.kernel.connection import new_connection_info
from kernel_sandbox.rundirs import runtime_root
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet
from tests.conftest import TEST_LABEL
from tests.integration.conftest import (
    PYTHON_IMAGE,
    TRANSPORTS,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Host memory one attack may add (resident or peak); the attacks offer far more.
MEMORY_BOUND = 64 << 20
#: Host disk one attack may add to the run directory (a FIFO and five sockets: ~0).
DISK_BOUND = 64 << 10
SOCKET_NAMES = [f"k-{n}" for n in range(1, 6)]


def host_memory() -> tuple[int, int]:
    """(resident bytes now, peak resident bytes so far) of this process."""
    with open("/proc/self/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return rss * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def disk_bytes(*paths: Path | None) -> int:
    """Bytes of every regular file under ``paths`` (links not followed)."""
    total = 0
    for root in paths:
        if root is None or not root.exists():
            continue
        for dirpath, _, names in os.walk(root):
            for name in names:
                info = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
    return total


class Meter:
    """Host memory and disk growth around one attack; fails past the bounds."""

    def __init__(self, what: str, *paths: Path | None) -> None:
        self.what, self.paths = what, paths

    def __enter__(self) -> Meter:
        self.rss, self.peak = host_memory()
        self.disk = disk_bytes(*self.paths)
        return self

    def __exit__(self, *exc: object) -> None:
        rss, peak = host_memory()
        grew = max(rss - self.rss, peak - self.peak)
        disk = disk_bytes(*self.paths) - self.disk
        print(f"\n[host-paths] {self.what}: host memory +{grew >> 20} MiB, disk +{disk} B")
        if exc[0] is None:
            assert grew <= MEMORY_BOUND, f"{self.what}: host memory grew {grew >> 20} MiB"
            assert disk <= DISK_BOUND, f"{self.what}: host disk grew {disk} B"


class Canary:
    """A unix socket on the host that counts who connects to it (nobody may)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(str(path))
        os.chmod(path, 0o777)
        self._server.listen(64)
        self._server.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self._server.close()


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Canary]:
    root = tmp_path_factory.mktemp("canary")
    root.chmod(0o755)
    watch = Canary(root / "canary.sock")
    yield watch
    watch.close()
    assert watch.connections == 0, "the host connected to a socket it did not create"


@pytest.fixture(scope="module")
def host_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root-owned host directory (0755) mounted read-write: only root may write in it."""
    root = tmp_path_factory.mktemp("hostpaths")
    (root / "guarded").mkdir(mode=0o755)
    (root / "guarded" / "secret").write_text("root only")
    (root / "guarded" / "secret").chmod(0o600)
    return root / "guarded"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=TRANSPORTS)
async def box(
    request: pytest.FixtureRequest, docker_engine: object, host_dir: Path
) -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create(
        image=PYTHON_IMAGE,
        labels=TEST_LABEL,
        transport=request.param,
        volumes={str(host_dir): {"bind": "/guarded", "mode": "rw"}},
    )
    try:
        yield sandbox
    finally:
        await sandbox.close()


def status_path(sandbox: AsyncSandbox) -> str:
    ipc = sandbox.config.transport == "ipc"
    return "/run/kernel-sandbox/status" if ipc else "/tmp/kernel-sandbox/status"


def run_dir_of(sandbox: AsyncSandbox) -> Path | None:
    """The sandbox's host run directory (ipc), None with tcp."""
    return runtime_root() / sandbox.id if sandbox.config.transport == "ipc" else None


def assert_run_dir_sealed(sandbox: AsyncSandbox) -> None:
    """ipc: the run directory holds only the host's files and the kernel's sockets, and
    nothing in it that can hold bytes is writable by the sandbox user."""
    if sandbox.config.transport == "tcp":  # nothing of the host is shared with the container
        return
    run_dir = run_dir_of(sandbox)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o755
    assert run_dir.stat().st_uid == os.getuid()
    entries = {e.name: os.lstat(e.path) for e in os.scandir(run_dir)}
    assert set(entries) <= {".owner", "status", *SOCKET_NAMES}, sorted(entries)
    assert stat.S_ISFIFO(entries["status"].st_mode)
    assert entries["status"].st_uid == os.getuid()
    for name in SOCKET_NAMES:
        assert stat.S_ISSOCK(entries[name].st_mode), name


async def assert_works(sandbox: AsyncSandbox) -> None:
    assert (await sandbox.run_python("print(6*7)")).stdout == "42\n"


# -- 4: status reads of files the sandbox controls ----------------------------------

PLANT_STATUS = """
import os
path = {path!r}
try:
    if os.path.lexists(path):
        os.remove(path)
    {make}
    print("planted")
except OSError as exc:
    print("refused", exc.errno)
"""


async def test_status_links_and_fifos_cost_the_host_nothing(box: AsyncSandbox) -> None:
    path = status_path(box)
    expected = "refused" if box.config.transport == "ipc" else "planted"
    for kind, make in (
        ("link to /dev/zero", "os.symlink('/dev/zero', path)"),
        ("FIFO", "os.mkfifo(path)"),
    ):
        planted = await box.run_python(PLANT_STATUS.format(path=path, make=make))
        assert planted.stdout.split()[0] == expected, planted.stdout
        # a cell silent for 3 s: the host checks the kernel's status several times
        with Meter(f"{box.config.transport} status {kind}", run_dir_of(box)):
            ex = await asyncio.wait_for(
                box.run_python("import time; time.sleep(3); print('done')", timeout=20), 120
            )
        assert ex.status == "ok" and ex.stdout == "done\n", (ex.status, ex.message)
    if box.config.transport == "tcp":  # the supervisor writes a new one at the next end
        await box.run_python(f"import os; os.remove({path!r})")
    # kernel deaths are still heard
    died = await box.run_python("import os; os.kill(os.getpid(), 9)")
    assert died.status == "kernel_died"
    await assert_works(box)
    assert_run_dir_sealed(box)


# -- 5: writes on sandbox paths -----------------------------------------------------


async def test_file_api_refuses_the_run_directory(box: AsyncSandbox) -> None:
    await box.run_python(
        "import os\nos.path.lexists('/tmp/rl') or os.symlink('/run/kernel-sandbox', '/tmp/rl')"
    )
    with Meter(f"{box.config.transport} writes into the run directory", run_dir_of(box)):
        for path in (
            "/run/kernel-sandbox/status",
            "/run/kernel-sandbox/new",
            "/tmp/rl/status",
            "/tmp/rl/k-1",
            "/run/kernel-sandbox/../kernel-sandbox/x",
        ):
            with pytest.raises(FileOperationError, match="kernel connection"):
                await box.files.write(path, b"x" * (1 << 20))
            with pytest.raises(FileOperationError, match="kernel connection"):
                await box.files.read(path)
        result = await ToolSet(box).execute(
            "file_operation",
            {"operation": "write", "file_path": "/tmp/rl/status", "content": "9 0 0 0\n"},
        )
        assert result.status == "error" and "kernel connection" in (result.error or "")
    assert_run_dir_sealed(box)
    died = await box.run_python("import os; os.kill(os.getpid(), 9)")
    assert died.status == "kernel_died"  # the status channel still works
    await assert_works(box)


SWAPPER = """
import os, threading, time
swapping = threading.Event()
swapping.set()
def swap(stop=time.monotonic() + {seconds}):
    while swapping.is_set() and time.monotonic() < stop:
        for target in {targets!r}:
            try:
                os.mkdir('/tmp/swap')
            except OSError:
                pass
            time.sleep(0.0005)
            try:
                os.rmdir('/tmp/swap')
            except OSError:
                import shutil; shutil.rmtree('/tmp/swap', ignore_errors=True)
            try:
                os.symlink(target, '/tmp/swap')
            except OSError:
                pass
            time.sleep(0.0005)
            try:
                os.remove('/tmp/swap')
            except OSError:
                pass
swapper = threading.Thread(target=swap, daemon=True)
swapper.start()
"""


async def test_folder_to_link_swap_never_writes_the_host(box: AsyncSandbox, host_dir: Path) -> None:
    before = sorted(p.name for p in host_dir.iterdir())
    targets = ["/guarded", "/run/kernel-sandbox"]
    await box.run_python(SWAPPER.format(seconds=15, targets=targets))
    landed = refused = 0
    with Meter(f"{box.config.transport} folder/link swap", run_dir_of(box), host_dir):
        deadline = time.monotonic() + 12
        n = 0
        while time.monotonic() < deadline:
            n += 1
            try:
                await box.files.write(f"/tmp/swap/f{n}", b"pwned")
                landed += 1
            except FileOperationError:
                refused += 1
    print(f"\n[host-paths] swap race: {landed} writes landed in /tmp/swap, {refused} refused")
    assert landed + refused > 10
    assert sorted(p.name for p in host_dir.iterdir()) == before
    assert_run_dir_sealed(box)
    ended = await box.run_python("swapping.clear(); swapper.join(); print('ended')")
    assert ended.stdout == "ended\n", ended.text  # the swapper ended
    await assert_works(box)


async def test_files_land_owned_by_the_sandbox_user(box: AsyncSandbox) -> None:
    await box.files.write("owned/by/me.txt", "mine")
    # find, not stat: Debian's runsc breaks stat(1) ("Invalid argument"), see the README
    ids = await box.run_shell("find owned/by/me.txt owned/by -maxdepth 0 -printf '%U %u\\n'; id -u")
    lines = ids.stdout.split("\n")
    uid = lines[2].strip()
    assert lines[0].split()[0] == uid and lines[1].split()[0] == uid, ids.stdout
    with pytest.raises(FileOperationError, match=r"Permission denied|Read-only"):
        await box.files.write("/guarded/new", "x")
    with pytest.raises(FileOperationError, match=r"Permission denied|Read-only"):
        await box.files.write("/etc/ld.so.preload", "x")


# -- 8: reads obey the sandbox user's permissions -----------------------------------


async def test_reads_obey_the_sandbox_users_permissions(box: AsyncSandbox) -> None:
    with Meter(f"{box.config.transport} forbidden reads"):
        for path in ("/etc/shadow", "/guarded/secret"):
            with pytest.raises(FileOperationError, match="Permission denied"):
                await box.files.read(path)
            result = await ToolSet(box).execute(
                "file_operation", {"operation": "read", "file_path": path}
            )
            assert result.status == "error" and "root only" not in result.output
            assert "root:" not in result.output
    await box.run_python(
        "import os\n"
        "for p in ('/tmp/zero', '/tmp/fifo'):\n"
        "    os.path.lexists(p) and os.remove(p)\n"
        "os.symlink('/dev/zero', '/tmp/zero'); os.mkfifo('/tmp/fifo')"
    )
    with Meter(f"{box.config.transport} reads of /dev/zero and a FIFO"):
        for path in ("/dev/zero", "/tmp/zero", "/tmp/fifo", "/dev/urandom"):
            with pytest.raises(FileOperationError, match="not a regular file"):
                await asyncio.wait_for(box.files.read(path), 60)
    with pytest.raises(SandboxFileNotFoundError):
        await box.files.read("/nonexistent")
    await box.files.write("big.bin", b"\0" * 2048)
    small = box.config.with_overrides(max_file_bytes=1024)
    original, box.config = box.config, small
    try:
        with pytest.raises(FileOperationError, match=r"2\.0 KB; files are read whole"):
            await box.files.read("big.bin")
    finally:
        box.config = original
    assert await box.files.read("big.bin") == b"\0" * 2048


# -- 6: the host connecting to planted sockets --------------------------------------


async def test_close_never_connects_to_planted_links(tmp_path: Path, canary: Canary) -> None:
    run_dir = tmp_path / "planted"
    run_dir.mkdir()
    for name in SOCKET_NAMES:
        (run_dir / name).symlink_to(canary.path)
    info = new_connection_info("ipc", str(run_dir / "k"))
    never = KernelSession(info)
    never.close()  # closed before connecting (a start that failed early)
    refused = KernelSession(info)

    async def alive() -> None:
        return None

    with pytest.raises(KernelError, match="is a link"):
        await refused.connect(5, alive)
    refused.close()
    await asyncio.sleep(0.5)  # ZMQ connects in its own thread
    assert canary.connections == 0


PLANTER = """
import os, subprocess, sys
code = '''
import os, time
canary = {canary!r}
while True:
    for name in {names!r}:
        path = "/run/kernel-sandbox/" + name
        try:
            os.symlink(canary, path + ".tmp")
            os.replace(path + ".tmp", path)
        except OSError:
            pass
    try:
        os.mkdir("/run/kernel-sandbox/k-2")
    except OSError:
        pass
    time.sleep(0.001)
'''
subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.kill(os.getppid(), 19)  # SIGSTOP the supervisor: only a container restart helps now
print("stopped")
"""


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_container_restart_opens_nothing_to_the_old_container(
    docker_engine: object, canary: Canary, transport: str
) -> None:
    sandbox = await AsyncSandbox.create(image=PYTHON_IMAGE, labels=TEST_LABEL, transport=transport)
    try:
        planted = await sandbox.run_python(
            PLANTER.format(canary=str(canary.path), names=SOCKET_NAMES)
        )
        assert planted.stdout == "stopped\n"
        with Meter(f"{transport} container restart with a planter", run_dir_of(sandbox)):
            await sandbox.restart()  # the supervisor is stopped: in place fails
        assert_run_dir_sealed(sandbox)
        await assert_works(sandbox)
        await sandbox.restart()  # and once more, in place this time
        await assert_works(sandbox)
        assert_run_dir_sealed(sandbox)
    finally:
        await sandbox.close()
    await asyncio.sleep(0.5)
    assert canary.connections == 0


# -- 7 (tcp): sandboxes reaching each other, ports that need the key -----------------


@pytest.mark.tcp_transport
async def test_tcp_sandboxes_cannot_reach_each_other(docker_engine: object) -> None:
    a = await AsyncSandbox.create(image=PYTHON_IMAGE, labels=TEST_LABEL, transport="tcp")
    b = await AsyncSandbox.create(image=PYTHON_IMAGE, labels=TEST_LABEL, transport="tcp")
    networks = []
    try:
        assert b.connection_info is not None
        target = (b.connection_info["ip"], b.connection_info["iopub_port"])
        probe = await a.run_python(
            "import socket\n"
            "try:\n"
            f"    socket.create_connection({target!r}, timeout=3).close(); print('reached')\n"
            "except OSError as exc:\n"
            "    print('unreachable', type(exc).__name__)"
        )
        print(f"\n[host-paths] tcp sandbox A to B's iopub: {probe.stdout.strip()}")
        assert probe.stdout.startswith("unreachable"), probe.stdout
        networks = [n for s in (a, b) if (n := getattr(s.host, "network", None)) is not None]
        assert len(set(networks)) == 2
        # A host process without the key (any local user) learns nothing from iopub.
        await assert_iopub_needs_the_key(b, target)
    finally:
        await a.close()
        await b.close()
    client = docker_engine
    left = [n for n in networks if client.networks.list(names=[n])]  # type: ignore[attr-defined]
    assert left == [], f"networks left after close: {left}"


async def assert_iopub_needs_the_key(sandbox: AsyncSandbox, target: tuple[str, int]) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://{target[0]}:{target[1]}")
    try:
        await asyncio.sleep(0.5)
        ex = await sandbox.run_python("for i in range(50): print('secret output', i)")
        assert ex.stdout.startswith("secret output 0")  # the host, with the key, hears it
        heard = sub.poll(2000)
        print(f"\n[host-paths] keyless iopub subscriber at {target}: {heard} message(s)")
        assert heard == 0, "a client without the key received iopub messages"
    finally:
        sub.close(0)
        context.term()


@pytest.mark.tcp_transport
async def test_published_ports_need_the_key(docker_engine: object) -> None:
    sandbox = await AsyncSandbox.create(
        image=PYTHON_IMAGE, labels=TEST_LABEL, transport="tcp", network_enabled=True
    )
    try:
        info = sandbox.connection_info
        assert info is not None
        assert info["ip"] == "127.0.0.1"  # published on the host's loopback
        await assert_iopub_needs_the_key(sandbox, ("127.0.0.1", info["iopub_port"]))
    finally:
        await sandbox.close()


# -- 9: listings ---------------------------------------------------------------------


async def test_listing_is_structured_and_capped(box: AsyncSandbox) -> None:
    await box.run_shell("rm -rf /tmp/many /tmp/odd; mkdir -p /tmp/odd /tmp/many")
    await box.run_python(
        "open('/tmp/odd/a\\nfile\\t9999999\\tforged', 'w').write('x')\n"
        "open('/tmp/odd/plain', 'w').write('yy')"
    )
    odd = await box.files.list("/tmp/odd")
    assert [(e.name, e.type, e.size) for e in odd] == [
        ("a\nfile\t9999999\tforged", "file", 1),
        ("plain", "file", 2),
    ]
    await box.run_shell("cd /tmp/many && seq -f %0200g 12000 | xargs touch")
    with Meter(f"{box.config.transport} listing 12000 long names"):
        with pytest.raises(FileOperationError, match="more than 10000 entries"):
            await box.files.list("/tmp/many")
        assert len(await box.files.list("/tmp/many", limit=20_000)) == 12_000
    await box.run_shell("rm -rf /tmp/many")
