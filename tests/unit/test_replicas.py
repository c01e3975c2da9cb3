"""The state file server workers share per sandbox (:mod:`kernel_sandbox.server.replicas`)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sandbox.backends.base import SandboxRecord
from kernel_sandbox.errors import CapacityError, SandboxNotFoundError
from kernel_sandbox.notebook import shared
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.notebook.storage import read_notebook
from kernel_sandbox.server import replicas
from kernel_sandbox.server.election import ORPHAN_GRACE, lease_name, orphans
from kernel_sandbox.server.labels import SERVER_ID_LABEL, SERVER_KEY_LABEL
from kernel_sandbox.server.recording import record_sandbox
from kernel_sandbox.server.settings import ServerSettings
from kernel_sandbox.server.tenancy import Lease, Tenancy
from tests.unit.conftest import NewSandbox


def _state(tmp_path: Path) -> Path:
    path = replicas.state_path(tmp_path, "abcd", "0123456789ab")
    assert path is not None
    path.parent.mkdir()
    replicas.mark_live(path)
    return path


@pytest.mark.parametrize("sid", ["../x", "a/b", "", ".hidden", "x" * 65, 7, None])
def test_ids_that_could_be_paths_have_no_state_file(tmp_path: Path, sid: object) -> None:
    assert replicas.state_path(tmp_path, "abcd", sid) is None
    assert replicas.state_path(tmp_path, "../etc", "abc") is None


async def test_calls_take_turns_and_the_mtime_follows_use(tmp_path: Path) -> None:
    path = _state(tmp_path)
    os.utime(path, (1, 1))
    order: list[str] = []

    async def call(name: str) -> None:
        async with replicas.call_lock(path, 10) as died:
            assert not died
            order.append(f"{name} in")
            assert replicas.holder(path) == replicas.identity()
            await asyncio.sleep(0.05)
            order.append(f"{name} out")

    await asyncio.gather(call("a"), call("b"))
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])
    assert replicas.holder(path) == ""  # nobody in a call
    idle = replicas.idle_for(path)
    assert idle is not None and idle < 60


async def test_busy_lock_is_refused_without_waiting_and_after_the_wait(tmp_path: Path) -> None:
    path = _state(tmp_path)
    async with replicas.call_lock(path, 10):
        with pytest.raises(CapacityError):
            async with replicas.call_lock(path, 10, block=False):
                pass
        with pytest.raises(CapacityError, match="another worker"):
            async with replicas.call_lock(path, 0.05):
                pass


def _other_identity() -> str:
    """Another process's identity (one that ended)."""
    code = "from kernel_sandbox.server import replicas; print(replicas.identity())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip()


def test_the_identity_names_host_pid_and_process() -> None:
    host, pid, nonce = replicas.identity().split(":")
    assert (host, int(pid)) == (socket.gethostname(), os.getpid()) and len(nonce) == 8
    assert replicas.identity() == replicas.identity()
    assert _other_identity() != replicas.identity()


@pytest.mark.parametrize("left", ["other", "same pid, restarted", "another pod, same pid"])
async def test_a_dead_holder_is_told_and_a_removed_sandbox_is_gone(
    tmp_path: Path, left: str
) -> None:
    path = _state(tmp_path)
    host, pid, _ = replicas.identity().split(":")
    dead = {  # what a worker killed inside a call leaves
        "other": _other_identity(),
        # a server container started again in its pod: same host name, same pid (1)
        "same pid, restarted": f"{host}:{pid}:00000000",
        # a replica in another pod: its pid namespace has the same pid
        "another pod, same pid": f"server-7d9f-x2x:{pid}:12345678",
    }[left]  # fmt: skip
    path.write_text(path.read_text() + dead)  # after its generation
    assert replicas.holder_died(path)  # a worker adopting it now interrupts first
    assert replicas.holder_died(path)  # looking changes nothing
    async with replicas.call_lock(path, 1) as died:
        assert died
        assert not replicas.holder_died(path)  # a live holder: its call runs
    async with replicas.call_lock(path, 1) as died:
        assert not died

    async def delete_while_waited_for() -> None:
        async with replicas.call_lock(path, 5):
            await asyncio.sleep(0.05)
            replicas.drop(path)

    holder = asyncio.ensure_future(delete_while_waited_for())
    await asyncio.sleep(0.01)
    with pytest.raises(SandboxNotFoundError):
        async with replicas.call_lock(path, 5):
            pass
    await holder
    assert not replicas.is_live(path) and replicas.idle_for(path) is None
    assert not replicas.holder_died(path)
    assert replicas.live_states(tmp_path) == []


async def test_a_sandbox_made_live_again_has_another_generation(tmp_path: Path) -> None:
    path = _state(tmp_path)
    first = replicas.generation(path)
    assert first and len(first) == 16
    assert replicas.mark_live(path) == first  # a restart marks it again: the same
    async with replicas.call_lock(path, 1):
        assert replicas.generation(path) == first  # a call keeps it
        assert replicas.holder(path) == replicas.identity()
    assert replicas.generation(path) == first and replicas.holder(path) == ""
    replicas.drop(path)  # paused, say
    assert replicas.generation(path) is None
    again = replicas.mark_live(path)  # and resumed: another kernel under the same id
    assert again != first and replicas.generation(path) == again
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left
    path.write_text("")  # made by an earlier version: no generation, holders at 0
    assert replicas.generation(path) == ""
    async with replicas.call_lock(path, 1):
        assert path.read_text() == replicas.identity()


def test_one_reaper_at_a_time(tmp_path: Path) -> None:
    with replicas.reaper_turn(tmp_path) as first:
        assert first
        taken = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; "
             "from kernel_sandbox.server.replicas import reaper_turn\n"
             "with reaper_turn(Path(sys.argv[1])) as mine: print(mine)", str(tmp_path)],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert taken == "False"
    with replicas.reaper_turn(tmp_path) as again:
        assert again


@pytest.mark.parametrize(
    "unsupported", [{"pool_size": 1}, {"pause_after": 5.0}, {"on_restart": "restore"}]
)
def test_several_workers_refuse_what_they_do_not_share_yet(unsupported: dict[str, object]) -> None:
    ServerSettings(workers=1, **unsupported)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not supported with several workers"):
        ServerSettings(workers=2, **unsupported)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not supported with several workers or replicas"):
        ServerSettings(replica=True, **unsupported)  # type: ignore[arg-type]


def test_orphans_are_labelled_sandboxes_no_process_serves_once_old_enough(
    tmp_path: Path,
) -> None:
    settings = ServerSettings(record_dir=tmp_path, replica=True)
    now = 10_000.0
    old, young = now - ORPHAN_GRACE - 1, now - ORPHAN_GRACE + 60

    def row(sid: str, created: float | None, owner: str | None = "abcd") -> SandboxRecord:
        labels = {"kernel-sandbox.id": f"c-{sid}", SERVER_ID_LABEL: sid}
        if owner is not None:
            labels[SERVER_KEY_LABEL] = owner
        return SandboxRecord("docker", sid, sid, "img", "running", labels, created)

    served = replicas.state_path(tmp_path, "abcd", "served")
    assert served is not None
    served.parent.mkdir()
    replicas.mark_live(served)
    rows = [
        row("served", old),  # a live state file: some process serves it
        row("gone", old),  # none: its state file was dropped, or never written
        row("making", young),  # none yet: a create may still be under way
        row("unowned", old, owner=None),  # no owner label: nobody can serve it
        row("unknown", None),  # the engine does not say when: left alone
        row("../x", old),  # an id that could be a path has no state file
    ]
    assert [r.resource_id for r in orphans(settings, rows, now)] == ["gone", "unowned", "../x"]


def test_the_lease_name_is_a_dns_name() -> None:
    assert lease_name("default") == "kernel-sandbox-reaper-default"
    name = lease_name("My_Server.prod/eu" + "x" * 80)
    assert name.startswith("kernel-sandbox-reaper-my-server-prod-eu") and len(name) <= 63
    assert lease_name("__") == "kernel-sandbox-reaper-server"


def test_a_dropped_sandbox_leaves_no_turn_fifo(tmp_path: Path) -> None:
    """The notebook's turn FIFO (a worker kept the turn) goes with the state file; the
    notebook stays."""
    path = _state(tmp_path)
    notebook = path.with_suffix(".ipynb")
    rec = NotebookRecorder(notebook, title="t", flush_delay=3600)
    rec.add_note("call")
    rec.keep_turn()
    assert shared.turn_path(notebook) == shared.turn_path(path)  # what drop removes
    assert shared.turn_path(notebook).is_fifo()
    rec.finish()
    replicas.drop(path)
    assert sorted(p.name for p in path.parent.iterdir()) == [notebook.name]


@pytest.mark.parametrize(
    ("settings", "keeps"),
    [
        ({"workers": 2}, True),
        ({"replica": True}, False),  # its volume may be shared across hosts
        ({"replica": True, "keep_notebook_turns": True}, True),  # one node's volume
        ({"workers": 2, "keep_notebook_turns": False}, False),
        ({"keep_notebook_turns": True}, False),  # one process: nobody to keep it from
    ],
)
def test_who_keeps_notebook_turns(settings: dict[str, object], keeps: bool) -> None:
    assert Tenancy(ServerSettings(**settings)).keeps_turns is keeps  # type: ignore[arg-type]


def test_serve_keeps_notebook_turns_when_told_on_the_command_line_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--keep-notebook-turns`` or KERNEL_SANDBOX_KEEP_NOTEBOOK_TURNS (what
    deploy/kubernetes-local sets); the command line wins; unset: the default (None)."""
    from click.testing import CliRunner

    from kernel_sandbox.cli import serve as serve_cli

    seen: list[ServerSettings] = []

    def made(settings: ServerSettings) -> None:  # the settings serve made: stop there
        seen.append(settings)
        raise SystemExit(0)

    monkeypatch.setattr(ServerSettings, "check_bind", made)
    for args, env, keep in (
        ([], {}, None),
        ([], {"KERNEL_SANDBOX_KEEP_NOTEBOOK_TURNS": "true"}, True),
        (["--no-keep-notebook-turns"], {"KERNEL_SANDBOX_KEEP_NOTEBOOK_TURNS": "true"}, False),
        (["--keep-notebook-turns"], {}, True),
    ):
        done = CliRunner().invoke(
            serve_cli.serve, ["--replica", "--api-key", "k" * 32, *args], env=env
        )
        assert done.exit_code == 0, done.output
        assert seen.pop().keep_notebook_turns is keep


@pytest.mark.parametrize(
    "several", [{"workers": 2}, {"replica": True}, {"replica": True, "keep_notebook_turns": True}]
)
async def test_a_call_cancelled_as_it_ends_has_its_cell_written_before_the_next_call(
    tmp_path: Path, new_sandbox: NewSandbox, several: dict[str, object]
) -> None:
    """A recorded call cancelled just as it ends (its answer made, its cell not built
    yet): the cell is still in memory and the notebook's turn still taken (a worker keeps
    it, a replica writes under it) before the call lock goes, so the next call's cell,
    by another process, comes after it."""
    state = _state(tmp_path)
    notebook = state.with_suffix(".ipynb")
    ten = Tenancy(ServerSettings(record_dir=tmp_path, **several))  # type: ignore[arg-type]
    sandbox = await new_sandbox()
    recorder = record_sandbox(sandbox, notebook, "t", {}, flush_delay=3600)
    lease = Lease(state.stem, state.parent.name, "docker", sandbox, recorder)

    async def call() -> None:
        async with ten._called(lease, state):
            await sandbox.run_code("x = 1")
            asyncio.get_running_loop().call_soon(running.cancel)  # lands as the call ends

    running = asyncio.ensure_future(call())
    with pytest.raises(asyncio.CancelledError):
        await running
    other = NotebookRecorder(notebook, flush_delay=3600)  # the next call's, another process's
    async with replicas.call_lock(state, 10):
        other.add_note("next call")
        await asyncio.to_thread(other.flush)
    cells = [cell.source for cell in read_notebook(notebook).cells]
    assert cells[-2:] == ["x = 1", "next call"]
    recorder.finish()
