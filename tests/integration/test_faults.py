"""Faults from outside: containers killed or removed, the kernel killed, the engine
restarted, the owner process killed.  Each must give a clear, structured answer on the
next call (or recover and say what was lost), keep the manager's view true, keep
recorded notebooks valid, and leave ``kernel-sandbox gc`` able to clean up exactly
what is orphaned.

Time from fault to answer and time to recover are printed (``pytest -s``) as
``FAULT-TIMING`` lines; they are measurements, never assertions.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import nbformat
import pytest

from kernel_sandbox import rundirs
from kernel_sandbox.agent import Agent, RetryPolicy
from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.errors import (
    ContainerRemovedError,
    ContainerStoppedError,
    EngineUnavailableError,
    KernelError,
    SandboxFileNotFoundError,
)
from kernel_sandbox.manager import SandboxManager, SandboxStatus
from kernel_sandbox.notebook import META_KEY
from kernel_sandbox.rundirs import runtime_root
from kernel_sandbox.sandbox import AsyncSandbox
from tests.conftest import TEST_LABEL, require
from tests.openai_server import ScriptedOpenAIServer, call, text, tool_calls
from tests.waiting import await_for, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "kernel-sandbox:python"
#: Generous: other test runs share the two cores.
DEADLINE = 120.0


def _report(case: str, what: str, seconds: float) -> None:
    print(f"\nFAULT-TIMING {case}: {what} {seconds:.2f} s", flush=True)


def _docker(*args: str, host: str | None = None) -> str:
    """The docker CLI, i.e. a fault from outside this process."""
    prefix = ["docker", "-H", host] if host else ["docker"]
    done = subprocess.run([*prefix, *args], capture_output=True, text=True, check=True)
    return done.stdout


def _kernel_pid(container_id: str) -> int:
    """Host pid of the ipykernel process, from ``docker top`` (no tools needed inside)."""
    for line in _docker("top", container_id, "-eo", "pid,args").splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        # The kernel is the python process; Docker's init and the supervisor carry the
        # launcher's text in their arguments too.
        if args.split()[0].endswith("python") and "ipykernel" in args:
            return int(pid)
    raise AssertionError("no ipykernel process in the container")


# -- 1. docker kill ------------------------------------------------------------------------


async def test_a_killed_container_restarts_on_the_next_python_call_and_says_files_are_lost(
    make_sandbox,
) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image=IMAGE)
    await sandbox.files.write("keep.txt", "kept")
    assert (await sandbox.run_python("x = 1")).ok
    _docker("kill", sandbox.container_id)
    # Shell needs a running container: a clear error saying what brings it back.
    with pytest.raises(ContainerStoppedError, match="run_python or restart"):
        await sandbox.run_shell("echo hi")
    started = time.monotonic()
    died = await sandbox.run_python("x")
    _report(
        "kill-between-calls", "run_python -> kernel_died + restarted", time.monotonic() - started
    )
    assert died.status == "kernel_died" and died.state_lost
    assert "SIGKILL" in died.message and "restarted" in died.message
    # The writable area lives in memory: a stopped container lost it, and the result says so.
    assert "files written in the sandbox may be lost" in died.message
    again = await sandbox.run_python("'x' in globals()")
    assert again.ok and again.result["data"]["text/plain"] == "False"
    assert not await sandbox.files.exists("keep.txt")
    await sandbox.files.write("keep.txt", "new")  # the new writable area works
    assert (await sandbox.run_shell("cat keep.txt")).stdout == "new"


async def test_a_container_killed_during_a_long_call_ends_that_call(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image=IMAGE)
    call_task = asyncio.create_task(
        sandbox.run_python("open('started', 'w').close()\nimport time\ntime.sleep(30)")
    )
    await await_for(lambda: sandbox.files.exists("started"), DEADLINE, 0.1, "the call to start")
    _docker("kill", sandbox.container_id)
    killed = time.monotonic()
    died = await call_task
    _report("kill-during-call", "long call -> kernel_died", time.monotonic() - killed)
    assert died.status == "kernel_died" and died.state_lost and "SIGKILL" in died.message
    assert died.duration < 30  # the sleep did not run to its end
    recovered = await sandbox.run_python("1 + 1")
    _report("kill-during-call", "fault -> next call ok", time.monotonic() - killed)
    assert recovered.ok and not await sandbox.files.exists("started")  # in-memory area lost


# -- 2. docker rm -f -----------------------------------------------------------------------


async def test_a_removed_container_gives_clear_errors_and_close_still_works(
    make_sandbox,
) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image=IMAGE)
    _docker("rm", "-f", sandbox.container_id)
    removed = time.monotonic()
    died = await sandbox.run_python("1")
    _report("rm-f", "run_python -> kernel_died", time.monotonic() - removed)
    assert died.status == "kernel_died" and "removed from outside" in died.message
    assert "create a new sandbox" in died.message
    for operation in (
        lambda: sandbox.run_shell("echo"),
        lambda: sandbox.files.read("x"),
        lambda: sandbox.files.write("x", "y"),
        lambda: sandbox.files.list(),
    ):
        started = time.monotonic()
        with pytest.raises(ContainerRemovedError, match="create a new sandbox"):
            await operation()
        _report("rm-f", "shell/files -> ContainerRemovedError", time.monotonic() - started)
    with pytest.raises(KernelError, match="removed from outside"):
        await sandbox.restart()
    again = await sandbox.run_python("1")  # still data, still no hang
    assert again.status == "kernel_died" and "removed from outside" in again.message
    await sandbox.close()
    assert sandbox.closed


# -- 4. kernel killed inside the container -------------------------------------------------


async def test_a_kernel_killed_from_outside_is_reported_then_recovered(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image=IMAGE)
    await sandbox.files.write("data.csv", "a\n1\n")
    assert (await sandbox.run_python("y = 2")).ok
    os.kill(_kernel_pid(sandbox.container_id), signal.SIGKILL)
    killed = time.monotonic()
    died = await sandbox.run_python("y")
    _report("kernel-killed", "run_python -> kernel_died + restarted", time.monotonic() - killed)
    assert died.status == "kernel_died" and died.state_lost
    assert "the kernel process" in died.message and "restarted" in died.message
    back = await sandbox.run_python("open('data.csv').read()")
    assert back.ok and "a\\n1\\n" in back.result["data"]["text/plain"]


# -- 6. manager and agent ------------------------------------------------------------------


async def test_the_manager_reports_real_status_and_refuses_a_removed_sandbox(docker_engine) -> None:  # type: ignore[no-untyped-def]
    async with SandboxManager(labels=TEST_LABEL) as manager:
        tools = {"python_executor": {}, "shell_executor": {}, "file_operation": {}}
        sid = await manager.create_sandbox(config={"image": IMAGE, "tools_config": tools})
        sandbox = await manager.get_sandbox(sid)
        _docker("kill", sandbox.container_id)
        info = await manager.get_sandbox_info(sid)
        assert info.status == SandboxStatus.ERROR and "SIGKILL" in info.metadata["error"]
        assert (await manager.get_stats())["status_counts"] == {"error": 1}
        result = await manager.execute_tool(sid, "python_executor", {"code": "1 + 1"})
        assert result.status == "error" and result.metadata.get("state_lost"), result
        assert (await manager.get_sandbox_info(sid)).status == SandboxStatus.RUNNING

        _docker("rm", "-f", sandbox.container_id)
        for tool, args in [
            ("python_executor", {"code": "1"}),
            ("shell_executor", {"command": "echo"}),
            ("file_operation", {"operation": "read", "file_path": "x"}),
        ]:
            started = time.monotonic()
            result = await manager.execute_tool(sid, tool, args)
            _report("manager-rm-f", f"{tool} -> error", time.monotonic() - started)
            assert result.status == "error", result
            assert f"sandbox {sid}" in result.error and "must be recreated" in result.error
        listed = await manager.list_sandboxes()
        assert [(i.id, i.status) for i in listed] == [(sid, SandboxStatus.ERROR)]
        assert "removed from outside" in listed[0].metadata["error"]
        assert (await manager.get_stats())["status_counts"] == {"error": 1}
        assert await manager.delete_sandbox(sid)
        assert await manager.list_sandboxes() == []
        await manager.cleanup_all_sandboxes()


async def test_an_agent_whose_sandbox_is_removed_records_it_and_ends(
    make_sandbox, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    sandbox = await make_sandbox(image=IMAGE)

    def remove_then_call(request):  # type: ignore[no-untyped-def]
        _docker("rm", "-f", sandbox.container_id)
        return tool_calls(call("python_executor", {"code": "x", "timeout": None}))

    with ScriptedOpenAIServer(
        [
            tool_calls(call("python_executor", {"code": "x = 41", "timeout": None})),
            remove_then_call,
            text("The sandbox is gone; stopping."),
        ]
    ) as server:
        agent = Agent(
            base_url=server.base_url,
            api_key="test",
            model="scripted",
            notebook_dir=tmp_path,
            sandbox=sandbox,
            retry=RetryPolicy(max_retries=1, initial_delay=0.01, max_delay=0.05),
        )
        result = await agent.arun("use the sandbox")
        sent_back = [m for m in server.chat_requests[-1].messages if m["role"] == "tool"]
    assert result.status == "completed", result
    assert "removed from outside" in sent_back[-1]["content"]
    nb = nbformat.read(result.notebook_path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata[META_KEY]["status"] != "running"
    shown = str([c.get("outputs", c.source) for c in nb.cells])
    assert "removed from outside" in shown  # the failure is in the record


# -- 5. owner process killed: gc -----------------------------------------------------------

ORPHAN_MAKER = """
import sys
from kernel_sandbox.sync import Sandbox
labels = dict(arg.split("=") for arg in sys.argv[1:])
made = [Sandbox.create(image="kernel-sandbox:python", labels=labels) for _ in range(3)]
print(" ".join(s.id for s in made), flush=True)
sys.stdin.read()  # wait to be killed
"""


def _orphans(labels: dict[str, str], env: dict[str, str]) -> list[str]:
    """Start a process that makes 3 sandboxes, SIGKILL it; the ids it left behind."""
    maker = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_MAKER, *(f"{k}={v}" for k, v in labels.items())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert maker.stdout is not None
    ids = maker.stdout.readline().split()
    os.kill(maker.pid, signal.SIGKILL)
    maker.wait()
    assert len(ids) == 3, "the orphan maker did not start its sandboxes"
    return ids


def _gc(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli.main", "gc", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def private_runtime(tmp_path, monkeypatch) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """A runtime root of this test's own: gc here must never see other runs' directories."""
    root = tmp_path / "runtime"
    monkeypatch.setenv("KERNEL_SANDBOX_RUNTIME_DIR", str(root))
    yield {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.orphans  # gc
async def test_gc_removes_exactly_the_orphans_of_a_killed_process(
    docker_engine, make_sandbox, private_runtime
) -> None:  # type: ignore[no-untyped-def]
    root = Path(private_runtime["KERNEL_SANDBOX_RUNTIME_DIR"])
    run = uuid.uuid4().hex[:12]
    labels = {**TEST_LABEL, "kernel-sandbox.test-run": run}
    orphan_ids = _orphans(labels, private_runtime)
    live = await make_sandbox(image=IMAGE)  # this process is alive: not an orphan
    unlabelled = docker_engine.containers.create(IMAGE, "true", labels={"test-run": run})
    foreign = docker_engine.containers.create(
        IMAGE,
        "true",
        labels={
            **labels,
            "kernel-sandbox": "true",
            "kernel-sandbox.owner-host": "some-other-host",
            "kernel-sandbox.owner-pid": "4194303",  # no such process here
        },
    )
    old = time.time() - 3600
    starting = root / "just-made-by-a-starting-sandbox"  # young: its container is coming
    starting.mkdir()
    claimed = root / "claimed-by-a-live-process"  # e.g. a sandbox on another engine
    claimed.mkdir()
    claim = rundirs.claim(claimed)
    stale = root / "left-by-a-removed-sandbox"
    stale.mkdir()
    a_file = root / "not-a-directory"
    a_file.write_text("keep")
    for path in (claimed, stale, a_file):
        os.utime(path, (old, old))
    orphan_dirs = [root / sid for sid in orphan_ids]
    try:
        assert all(d.is_dir() for d in orphan_dirs)

        dry = _gc(private_runtime, "--dry-run")
        for sid in orphan_ids:
            assert f"would remove sandbox {sid}" in dry
        assert f"would remove host directory {stale}" in dry
        assert all(d.is_dir() for d in orphan_dirs) and stale.is_dir()
        listed = docker_engine.containers.list(
            all=True, filters={"label": f"kernel-sandbox.test-run={run}"}
        )
        assert len(listed) == 4  # 3 orphans and the foreign one

        started = time.monotonic()
        out = _gc(private_runtime)
        _report("gc", "3 orphans removed", time.monotonic() - started)
        for sid in orphan_ids:
            assert f"removing sandbox {sid}" in out
        left = {
            c.id
            for c in docker_engine.containers.list(
                all=True, filters={"label": f"kernel-sandbox.test-run={run}"}
            )
        }
        assert left == {foreign.id}
        unlabelled.reload()  # still there (raises NotFound otherwise)
        assert not any(d.exists() for d in orphan_dirs) and not stale.exists()
        assert starting.is_dir() and claimed.is_dir() and a_file.read_text() == "keep"
        assert (runtime_root() / live.id).is_dir()
        assert (await live.run_python("1 + 1")).ok  # the live sandbox was not touched
    finally:
        rundirs.release(claim)
        for container in (unlabelled, foreign):
            container.remove(force=True)
        for sid in orphan_ids:  # only if gc failed
            for c in docker_engine.containers.list(
                all=True, filters={"label": f"kernel-sandbox.id={sid}"}
            ):
                c.remove(force=True)


# -- 3. engine restarted -------------------------------------------------------------------


class PrivateEngine:
    """A second dockerd with its own data, exec root, socket and network namespace.

    Stopping it harms no one.  The network namespace matters: a dockerd started with
    ``--bridge=none`` deletes any ``docker0`` it sees, the main engine's included.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.socket = base / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.pidfile = base / "docker.pid"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.base / "dockerd.log").open("ab")
        self.process = subprocess.Popen(
            [
                "unshare", "--net",
                "dockerd",
                "--data-root", str(self.base / "data"),
                "--exec-root", str(self.base / "exec"),
                "-H", self.host,
                "--pidfile", str(self.pidfile),
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip

        def answers() -> bool:
            assert self.process is not None and self.process.poll() is None, (
                self.base / "dockerd.log"
            ).read_text()[-2000:]
            info = ["docker", "-H", self.host, "info"]
            return subprocess.run(info, capture_output=True).returncode == 0

        wait_for(answers, DEADLINE, 0.2, "the private engine to answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(DEADLINE)


@pytest.fixture
def private_engine() -> Iterator[PrivateEngine]:
    require(os.geteuid() == 0 and shutil.which("dockerd") is not None, "needs root and dockerd")
    base = Path(tempfile.mkdtemp(prefix="ks-engine-"))  # short: unix socket paths are limited
    engine = PrivateEngine(base)
    main_bridge = Path("/sys/class/net/docker0").exists()
    try:
        engine.start()
        started = time.monotonic()
        subprocess.run(
            f"docker save {IMAGE} | docker -H {engine.host} load",
            shell=True,
            check=True,
            capture_output=True,
        )
        _report(
            "engine-restart", f"loading {IMAGE} into the private engine", time.monotonic() - started
        )
        yield engine
    finally:
        engine.stop()
        subprocess.run(["umount", "-R", str(base)], capture_output=True)  # if dockerd left any
        shutil.rmtree(base, ignore_errors=True)
        assert not base.exists(), f"could not delete the private engine's files in {base}"
        assert Path("/sys/class/net/docker0").exists() == main_bridge, (
            "the private engine removed the main engine's docker0 bridge"
        )


@pytest.fixture
async def engine_sandbox(private_engine, private_runtime) -> AsyncIterator[AsyncSandbox]:  # type: ignore[no-untyped-def]
    client = docker.DockerClient(base_url=private_engine.host, timeout=60)
    sandbox = await AsyncSandbox.create(
        image=IMAGE, labels=TEST_LABEL, host=functools.partial(DockerHost, client=client)
    )
    yield sandbox
    await sandbox.close()
    client.close()


@pytest.mark.engine_restart
async def test_an_engine_restart_gives_clear_errors_then_the_sandbox_recovers(
    private_engine, engine_sandbox, private_runtime
) -> None:  # type: ignore[no-untyped-def]
    sandbox = engine_sandbox
    env = {**private_runtime, "DOCKER_HOST": private_engine.host}
    orphan_ids = _orphans(TEST_LABEL, env)
    await sandbox.files.write("keep.txt", "kept")
    assert (await sandbox.run_python("x = 1")).ok

    private_engine.stop()
    stopped = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="Cannot reach the Docker engine"):
        await sandbox.run_python("x")
    _report(
        "engine-restart",
        "run_python during outage -> EngineUnavailableError",
        time.monotonic() - stopped,
    )
    for operation in (lambda: sandbox.run_shell("echo"), lambda: sandbox.files.read("keep.txt")):
        with pytest.raises(EngineUnavailableError):
            await operation()

    private_engine.start()
    back = time.monotonic()
    died = await sandbox.run_python("x")  # the engine stopped the container on shutdown
    assert died.status == "kernel_died" and died.state_lost, died
    # The writable area is in memory: a stopped container loses it, and the result says so.
    assert "files" in (died.message or ""), died
    assert (await sandbox.run_python("1 + 1")).ok
    _report("engine-restart", "engine back -> sandbox usable", time.monotonic() - back)
    with pytest.raises(SandboxFileNotFoundError):
        await sandbox.files.read_text("keep.txt")

    out = _gc(env)
    for sid in orphan_ids:
        assert f"removing sandbox {sid}" in out
    client = docker.DockerClient(base_url=private_engine.host)
    left = client.containers.list(all=True, filters={"label": "kernel-sandbox=true"})
    assert [c.id for c in left] == [sandbox.container_id]
    client.close()
