"""Hostile code against a real sandbox, part 2: network, host secrets, neighbours, files.

Each case tries to reach something outside the sandbox (the network, the host's
environment and files, the engine's socket, another sandbox, a mounted host directory
beyond what was shared) and checks that it got nothing, then that the sandbox still
works.  Part 1 (processes, memory, kills, streams) is test_hostile.py.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet
from tests.conftest import TEST_LABEL
from tests.integration.conftest import GVISOR, PYTHON_IMAGE

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = secrets.token_hex(16)
ERRNO_DENIED = ("Permission denied", "Read-only file system")


@pytest.fixture(scope="module")
def host_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shared/ (mounted read-only), rw/ (mounted read-write) and a secret beside them."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "shared").mkdir()
    (root / "shared" / "visible.txt").write_text("shared on purpose")
    (root / "rw").mkdir()
    (root / "rw").chmod(0o777)  # the sandbox user is not the host user
    (root / "secret.txt").write_text(SECRET)
    return root


def host_tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def box(docker_engine: object, host_dir: Path) -> AsyncIterator[AsyncSandbox]:
    os.environ["KS_TEST_SECRET"] = SECRET  # in the host process, before the sandbox exists
    try:
        sandbox = await AsyncSandbox.create(
            image=PYTHON_IMAGE,
            labels=TEST_LABEL,
            volumes={
                str(host_dir / "shared"): {"bind": "/data", "mode": "ro"},
                str(host_dir / "rw"): {"bind": "/rw", "mode": "rw"},
            },
        )
    finally:
        del os.environ["KS_TEST_SECRET"]
    try:
        yield sandbox
    finally:
        await sandbox.close()


async def assert_works(sandbox: AsyncSandbox) -> None:
    assert (await sandbox.run_python("print(6*7)")).stdout == "42\n"
    assert (await sandbox.run_shell("echo $((6*7))")).stdout == "42\n"


# -- 5: network -------------------------------------------------------------------

CONNECT = (
    "import socket, time\n"
    "for target in [('1.1.1.1', 80), ('172.17.0.1', 80)]:\n"
    "    started = time.monotonic()\n"
    "    try:\n"
    "        socket.create_connection(target, timeout=10).close()\n"
    "        print(target[0], 'connected')\n"
    "    except OSError as exc:\n"
    "        print(target[0], type(exc).__name__, exc.errno, time.monotonic() - started)\n"
    "try:\n"
    "    socket.getaddrinfo('example.com', 80)\n"
    "    print('dns resolved')\n"
    "except OSError as exc:\n"
    "    print('dns', type(exc).__name__)\n"
    "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))"
)


UNREACH = "113" if GVISOR else "101"


async def test_no_route_out_from_python_or_the_shell(box: AsyncSandbox) -> None:
    ex = await box.run_python(CONNECT)
    lines = ex.stdout.splitlines()
    print(f"\n[hostile] connect attempts: {lines[:2]}")
    # ENETUNREACH: refused at once for want of a route, not left to the 10 s timeout
    # (gVisor's network stack says EHOSTUNREACH, as at once).
    unreachable = [line.split()[:3] for line in lines[:2]]
    assert unreachable == [["1.1.1.1", "OSError", UNREACH], ["172.17.0.1", "OSError", UNREACH]]
    assert lines[2] == "dns gaierror"
    assert lines[3] == "['lo']"
    shell = await box.run_shell(
        # the interfaces from /proc: gVisor has no /sys/class/net
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
        "getent hosts example.com || echo no-dns; "
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 10)\" 2>&1"
        " | tail -1"
    )
    assert shell.stdout.splitlines() == [
        "lo",
        "no-dns",
        "OSError: [Errno 113] No route to host"
        if GVISOR
        else "OSError: [Errno 101] Network is unreachable",
    ], shell


# -- 6: host secrets --------------------------------------------------------------


async def test_host_environment_does_not_reach_the_sandbox(box: AsyncSandbox) -> None:
    ex = await box.run_python(
        "import glob, os\nseen = [k for k, v in os.environ.items() if v == SECRET]\n"
        "for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n        seen += [path] if SECRET.encode() in open(path, 'rb').read() else []\n"
        "    except OSError:\n        pass\n"
        "print(seen)".replace("SECRET", repr(SECRET))
    )
    assert ex.stdout == "[]\n", ex.text
    shell = await box.run_shell("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert shell.ok and "PATH=" in shell.stdout and SECRET not in shell.stdout


async def test_host_files_and_the_engine_socket_are_out_of_reach(
    box: AsyncSandbox, host_dir: Path
) -> None:
    r = await box.run_shell(
        "find / -xdev -name secret.txt 2>/dev/null; "
        "grep -rl --exclude-dir=proc --exclude-dir=sys " + SECRET + " / 2>/dev/null; "
        "for s in /var/run/docker.sock /run/docker.sock; do test -e $s || echo no $s; done; "
        "find / -type s 2>/dev/null",
        timeout=120,
    )
    lines = r.stdout.splitlines()
    assert not any(SECRET in line or "secret.txt" in line for line in lines), lines
    assert "no /var/run/docker.sock" in lines and "no /run/docker.sock" in lines, lines
    sockets = sorted(line for line in lines if not line.startswith("no "))
    assert sockets == [f"/run/kernel-sandbox/k-{n}" for n in range(1, 6)], lines


# -- 7: another sandbox -----------------------------------------------------------


async def test_a_neighbour_sandbox_sees_nothing_of_this_one(
    box: AsyncSandbox,
    make_sandbox,  # type: ignore[no-untyped-def]
) -> None:
    mark = secrets.token_hex(8)
    sleeper = str(900_000 + int(mark[:4], 16))
    await box.run_python(f"neighbour_{mark} = 1")
    await box.run_shell(f"echo x > /sandbox/{mark}; echo x > /tmp/{mark}")
    await box.run_shell(f"nohup sleep {sleeper} >/dev/null 2>&1 &")
    other: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE)
    seen = await other.run_python(
        "import glob, os\n"
        f"print('neighbour_{mark}' in dir())\n"
        f"print(os.path.exists('/sandbox/{mark}'), os.path.exists('/tmp/{mark}'))\n"
        "print(sorted(os.listdir('/run/kernel-sandbox')))\n"
        "cmds = []\n"
        "for p in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n        cmds.append(open(p, 'rb').read())\n    except OSError:\n        pass\n"
        f"print(any(b'{sleeper}' in c for c in cmds), len(cmds))"
    )
    variable, files, run_dir, procs = seen.stdout.splitlines()
    assert (variable, files) == ("False", "False False")
    # Only its own kernel's sockets, its owner's claim and its supervisor's status FIFO.
    assert run_dir == str(sorted([".owner", "status", *(f"k-{n}" for n in range(1, 6))]))
    assert procs.split()[0] == "False" and int(procs.split()[1]) < 6, procs
    # The same probe in the first sandbox does see its own process: the check can fail.
    mine = await box.run_shell("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert sleeper in mine.stdout


# -- 8: writes outside mounted paths ----------------------------------------------


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "/usr/lib/x", "/opt/venv/lib/python3.11/site-packages/evil.pth"]
)
async def test_system_paths_are_not_writable(box: AsyncSandbox, path: str) -> None:
    ex = await box.run_python(f"open({path!r}, 'a').write('pwned')")
    assert ex.status == "error" and ex.error is not None
    assert ex.error.ename in ("PermissionError", "OSError"), ex.error.summary
    assert any(reason in ex.error.evalue for reason in ERRNO_DENIED), ex.error.summary
    r = await box.run_shell(f"echo pwned >> {path}")
    assert not r.ok and any(reason in r.stderr for reason in ERRNO_DENIED), r
    await assert_works(box)


# -- 9: file_operation toward mounted host directories -----------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def links(box: AsyncSandbox) -> AsyncSandbox:
    r = await box.run_shell(
        "ln -s / /sandbox/root && ln -s /data/.. /sandbox/up && "
        "ln -s /run/kernel-sandbox /sandbox/rd && ln -s /data /sandbox/d && "
        "ln -s loop2 /sandbox/loop1 && ln -s loop1 /sandbox/loop2 && ln -s self /sandbox/self"
    )
    assert r.ok, r
    return box


TRICKS = [
    ("read", "/data/../secret.txt"),
    ("read", "../../data/../../secret.txt"),
    ("read", "/sandbox/up/secret.txt"),
    ("read", "/sandbox/root/../secret.txt"),
    ("read", "//data//..//secret.txt"),
    ("list", "/sandbox/up"),
    ("list", "/data/.."),
    ("list", "/sandbox/rd"),
    ("read", "/sandbox/loop1"),
    ("read", "/sandbox/self"),
    ("read", "/sandbox/rd/k-1"),
    ("read", "notes\x00/../../secret.txt"),
    ("read", "/etc/hostname\x00.txt"),
    ("write", "nul\x00name.txt"),
    ("read", "a/" * 3000 + "x"),
    ("write", "/data/new.txt"),
    ("write", "/sandbox/d/new.txt"),
    ("write", "//data//new.txt"),
    ("write", "/data/../secret.txt"),
    ("write", "/sandbox/up/secret.txt"),
    ("append", "/data/visible.txt"),
    ("delete", "/data/visible.txt"),
    ("delete", "/sandbox/d/visible.txt"),
    ("mkdir", "/data/sub"),
    ("write", "/rw/../escaped.txt"),
    ("write", "/rw/../../escaped.txt"),
    ("write", "x" * 5000),
]


@pytest.mark.parametrize(("operation", "path"), TRICKS, ids=[f"{o}:{p[:40]!r}" for o, p in TRICKS])
async def test_file_operation_never_reaches_beyond_the_mounts(
    links: AsyncSandbox, host_dir: Path, operation: str, path: str
) -> None:
    before = host_tree(host_dir)
    args: dict[str, object] = {"operation": operation, "file_path": path}
    if operation in ("write", "append"):
        args["content"] = "pwned"
    result = await ToolSet(links).execute("file_operation", args)
    shown = (result.error or result.output)[:150]
    print(f"\n[hostile] {operation} {path[:60]!r}: {result.status}: {shown!r}")
    assert SECRET not in result.output and SECRET not in (result.error or "")
    assert result.status in ("success", "error")
    if result.status == "error":
        assert result.error  # a sentence, not a traceback
        # and nothing of the host's layout: not the engine's storage, not the mount source
        assert "overlay2" not in result.error and str(host_dir) not in result.error
    after = host_tree(host_dir)
    # Nothing changed on the host, except a write through the rw mount that stays in it.
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert all(k.startswith("rw/") for k in changed), changed
    assert (host_dir / "shared" / "visible.txt").read_text() == "shared on purpose"
    await assert_works(links)


async def test_a_rw_mount_takes_writes_only_inside_itself(
    links: AsyncSandbox, host_dir: Path
) -> None:
    before = host_tree(host_dir)
    tools = ToolSet(links)
    ok = await tools.execute(
        "file_operation", {"operation": "write", "file_path": "/rw/sub/ok.txt", "content": "in"}
    )
    assert ok.status == "success", ok.error
    await links.run_shell("ln -sfn / /rw/out && echo via-link > /rw/out/tmp/via-link.txt")
    through = await tools.execute(
        "file_operation",
        {"operation": "write", "file_path": "/rw/out/tmp/tool.txt", "content": "tool"},
    )
    assert through.status in ("success", "error")
    after = host_tree(host_dir)
    added = sorted(set(after) - set(before))
    assert added == ["rw/out", "rw/sub", "rw/sub/ok.txt"] or added == [
        "rw/sub",
        "rw/sub/ok.txt",
    ], added
    assert (host_dir / "rw" / "sub" / "ok.txt").read_text() == "in"
    assert (host_dir / "rw" / "out").is_symlink()  # a link the host never followed
    assert not any(p.name in ("via-link.txt", "tool.txt") for p in host_dir.rglob("*"))


# -- 9b: the run directory is shared with the host ---------------------------------


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A unix socket on the host that records anything that connects to it."""
    path = str(tmp_path / "canary.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    server.settimeout(0.2)
    seen: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(0.5)
            try:
                seen.append(conn.recv(64))
            except OSError:
                seen.append(b"")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield path, seen
    stop.set()
    thread.join()
    server.close()


async def test_kernel_sockets_replaced_by_links_are_not_followed_by_the_host(
    make_sandbox,
    canary: tuple[str, list[bytes]],  # type: ignore[no-untyped-def]
) -> None:
    path, seen = canary
    sb: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE)
    # Try to make every kernel socket a link to a host socket, then kill the kernel, so
    # the host reconnects (ZMQ) and then restarts it (a fresh connect).  The sealed run
    # directory refuses the links; the host's sockets are pinned by descriptor anyway.
    ex = await sb.run_python(
        "import os\nfor n in range(1, 6):\n"
        "    p = f'/run/kernel-sandbox/k-{n}'\n"
        "    os.unlink(p)\n"
        f"    os.symlink({path!r}, p)\n"
    )
    assert ex.status == "error" and ex.error is not None, ex
    assert ex.error.ename == "PermissionError", ex.error
    died = await sb.run_python("import os; os._exit(1)")
    assert died.status == "kernel_died" and "restarted" in died.message, died.message
    after = await sb.run_python("print(6*7)")
    assert after.stdout == "42\n", after.text
    assert seen == [], f"the host connected to a socket the sandbox pointed at: {seen}"
