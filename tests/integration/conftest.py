"""Fixtures for the integration tier: a real Docker engine, real images, real kernels.

Every container a test makes carries the test label and is removed by the fixture
that made it; a session-end check removes (and reports) anything left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kernel_sandbox.config import RUNTIME_ENV
from kernel_sandbox.sandbox import AsyncSandbox
from tests.conftest import LOCKS, TEST_LABEL, host_lock, require

PYTHON_IMAGE = "kernel-sandbox:python"
DATASCIENCE_IMAGE = "kernel-sandbox:datascience"
#: The engine runtime every sandbox of this run gets by default (``make test`` runs the
#: hostile and core suites a second time with ``KERNEL_SANDBOX_RUNTIME=runsc``).
RUNTIME = os.environ.get(RUNTIME_ENV) or None
#: True when sandboxes run under gVisor: a few limits show themselves differently there
#: (no cgroup files inside, an OOM ends the whole container); the suites check both.
GVISOR = bool(RUNTIME and RUNTIME.startswith("runsc"))
#: Both transports, the tcp one marked: gVisor refuses it (``test_sandbox.py`` checks the
#: refusal), so ``make test-runsc`` deselects ``tcp_transport`` rather than skipping.
TRANSPORTS = ["ipc", pytest.param("tcp", marks=pytest.mark.tcp_transport)]

#: A program that opens one sandbox, prints its id and waits (to be killed, or to exit).
ORPHAN_MAKER = """
import sys
from kernel_sandbox.sync import Sandbox
sb = Sandbox.create(image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"})
print(sb.id, flush=True)
sys.stdin.read()  # wait to be killed
"""


def orphan_of_killed_owner(program: str = ORPHAN_MAKER) -> str:
    """Run ``program`` (``ORPHAN_MAKER``), SIGKILL it once its sandbox is up; its id."""
    maker = subprocess.Popen(
        [sys.executable, "-c", program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert maker.stdout is not None
    sandbox_id = maker.stdout.readline().strip()
    os.kill(maker.pid, signal.SIGKILL)
    maker.wait()
    return sandbox_id


def _engine():  # type: ignore[no-untyped-def]
    try:
        from kernel_sandbox.backends.docker import docker_client

        return docker_client()
    except Exception as exc:
        return exc


@pytest.fixture(scope="session")
def docker_engine():  # type: ignore[no-untyped-def]
    client = _engine()
    require(not isinstance(client, Exception), f"no Docker engine: {client}")
    if RUNTIME is not None:
        offered = client.api.info().get("Runtimes") or {}
        require(
            RUNTIME in offered,
            f"{RUNTIME_ENV}={RUNTIME} but the engine has no such runtime (it has "
            f"{', '.join(offered)}): see docs/how-to/gvisor.md",
        )
    for image in (PYTHON_IMAGE, DATASCIENCE_IMAGE):
        try:
            client.images.get(image)
        except Exception:
            require(False, f"image {image} missing: run `kernel-sandbox images build`")
    return client


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_containers() -> Iterator[None]:  # and volumes
    yield
    client = _engine()
    if isinstance(client, Exception):
        return
    # Only this process's containers: other test runs may share the engine.
    mine = ["kernel-sandbox.test=1", f"kernel-sandbox.owner-pid={os.getpid()}"]
    left = client.containers.list(all=True, filters={"label": mine})
    for container in left:
        container.remove(force=True)
    volumes = client.volumes.list(filters={"label": mine})
    for volume in volumes:
        volume.remove(force=True)
    assert not left, f"tests left containers behind: {[c.name for c in left]}"
    assert not volumes, f"tests left volumes behind: {[v.name for v in volumes]}"


@pytest.fixture(autouse=True)
def _orphans_one_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``orphans`` holds the host's orphans lock while it runs.

    ``kernel-sandbox gc`` removes every sandbox whose owner process is dead, whoever
    made it; a test that SIGKILLs an owner and then adopts, restarts or collects what
    it left would lose it to another test's ``gc`` in a process beside (an xdist
    worker, the gVisor pass, another run).  Marked tests take turns; others go on.
    """
    if request.node.get_closest_marker("orphans") is None:
        yield
        return
    with host_lock(LOCKS / "orphans.lock"):
        yield


@pytest.fixture
async def make_sandbox(docker_engine):  # type: ignore[no-untyped-def]
    """Factory: ``await make_sandbox(**overrides)``; all are closed after the test."""
    made: list[AsyncSandbox] = []

    async def _make(**overrides: object) -> AsyncSandbox:
        labels = {**TEST_LABEL, **overrides.pop("labels", {})}  # type: ignore[dict-item]
        sandbox = await AsyncSandbox.create(labels=labels, **overrides)
        made.append(sandbox)
        return sandbox

    yield _make
    for sandbox in made:
        await sandbox.close()


@pytest.fixture
async def sandbox(make_sandbox) -> AsyncIterator[AsyncSandbox]:  # type: ignore[no-untyped-def]
    """A default sandbox (datascience image, no network)."""
    yield await make_sandbox()


@pytest.fixture
async def py_sandbox(make_sandbox) -> AsyncIterator[AsyncSandbox]:  # type: ignore[no-untyped-def]
    """A sandbox on the small python image."""
    yield await make_sandbox(image=PYTHON_IMAGE)
