"""scripts/engine.sh decides what to set up, run on a fake machine.

The script runs for real with a PATH holding only a few real tools (bash, sed, nohup...)
and stand-ins for ``id``, ``docker``, ``dockerd``, ``pgrep`` and ``apt-get`` that log
their calls and change a fake machine's state (``apt-get install docker.io`` puts a
``dockerd`` on the PATH; ``dockerd`` makes ``docker info`` answer).  The real engine is
never reached, started or stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "engine.sh"
#: The script's own needs, plus ``cp`` for the apt-get stand-in.
REAL_TOOLS = ("bash", "env", "sed", "tr", "date", "sleep", "tail", "grep", "cat", "nohup", "cp")
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
UBUNTU = 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\n'
FEDORA = 'NAME="Fedora Linux"\nID=fedora\n'

#: Stand-ins: each logs "name args" to $FAKE/log, and acts on files in $FAKE.
STUBS = {
    "id": 'echo "${FAKE_UID:-1000}"',
    "docker": """
        echo "docker $*" >> "$FAKE/log"
        [ "$1" = info ] || exit 0
        if [ -e "$FAKE/denied" ]; then
            echo "permission denied while trying to connect to the Docker daemon socket" >&2
            exit 1
        fi
        if [ -e "$FAKE/up" ]; then
            n=$(cat "$FAKE/up")
            if [ "$n" -le 0 ]; then echo "Server Version: fake"; exit 0; fi
            echo $((n - 1)) > "$FAKE/up"
        fi
        echo "Cannot connect to the Docker daemon" >&2
        exit 1
    """,
    # Answers after $FAKE_UP_AFTER more `docker info` calls; "never" leaves it silent.
    "dockerd": """
        echo "dockerd $*" >> "$FAKE/log"
        [ "${FAKE_UP_AFTER:-0}" = never ] || echo "${FAKE_UP_AFTER:-0}" > "$FAKE/up"
    """,
    "pgrep": '[ -e "$FAKE/dockerd-running" ]',
    "apt-get": """
        echo "apt-get $*" >> "$FAKE/log"
        [ "$1" = install ] || exit 0
        for p in "$@"; do
            case "$p" in
                docker.io) cp "$FAKE/templates/docker" "$FAKE/templates/dockerd" "$FAKE/bin/" ;;
                debootstrap) cp "$FAKE/templates/debootstrap" "$FAKE/bin/" ;;
            esac
        done
    """,
    "debootstrap": 'echo "debootstrap $*" >> "$FAKE/log"',
}


@dataclass
class Run:
    code: int
    out: str
    err: str
    calls: list[str]


class FakeMachine:
    """A directory standing in for a machine: its PATH, its os-release, its engine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.templates = root / "templates"
        self.bin.mkdir()
        self.templates.mkdir()
        for tool in REAL_TOOLS:
            real = shutil.which(tool)
            assert real, f"{tool} is needed to test scripts/engine.sh"
            (self.bin / tool).symlink_to(real)
        for name, body in STUBS.items():
            stub = self.templates / name
            stub.write_text("#!/bin/bash\n" + textwrap.dedent(body).strip() + "\n")
            stub.chmod(0o755)
        self.install("id", "pgrep", "apt-get")
        self.os_release = root / "os-release"
        self.os_release.write_text(DEBIAN)

    def install(self, *names: str) -> None:
        for name in names:
            shutil.copy(self.templates / name, self.bin / name)

    def run(self, *, uid: int = 0, up_after: str = "0", **env: str) -> Run:
        log = self.root / "log"
        log.write_text("")
        result = subprocess.run(
            [str(self.bin / "bash"), str(SCRIPT)],
            env={
                "PATH": str(self.bin),
                "FAKE": str(self.root),
                "FAKE_UID": str(uid),
                "FAKE_UP_AFTER": up_after,
                "OS_RELEASE": str(self.os_release),
                "DOCKERD_LOG": str(self.root / "dockerd.log"),
                "ENGINE_DEADLINE": "20",
                **env,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Run(result.returncode, result.stdout, result.stderr, log.read_text().splitlines())


@pytest.fixture
def machine(tmp_path: Path) -> FakeMachine:
    return FakeMachine(tmp_path)


def _started(run: Run) -> bool:
    return any(c.startswith("dockerd") for c in run.calls)


def _apt(run: Run) -> list[str]:
    return [c for c in run.calls if c.startswith("apt-get")]


def test_a_running_engine_is_left_alone(machine: FakeMachine) -> None:
    machine.install("docker", "dockerd", "debootstrap")
    (machine.root / "up").write_text("0")
    run = machine.run(uid=1000)
    assert run.code == 0 and "the Docker engine is running" in run.out
    assert not _apt(run) and not _started(run)


@pytest.mark.parametrize("os_release", [DEBIAN, UBUNTU], ids=["debian", "ubuntu"])
def test_root_on_a_fresh_debian_installs_both_packages_and_starts_dockerd(
    machine: FakeMachine, os_release: str
) -> None:
    machine.os_release.write_text(os_release)
    run = machine.run(uid=0, up_after="2")
    assert run.code == 0, run.err
    assert _apt(run) == ["apt-get update -qq", "apt-get install -y -qq docker.io debootstrap"]
    assert _started(run) and "the Docker engine answers" in run.out
    assert (machine.bin / "debootstrap").exists()


def test_root_with_the_packages_only_starts_the_engine(machine: FakeMachine) -> None:
    machine.install("docker", "dockerd", "debootstrap")
    run = machine.run(uid=0)
    assert run.code == 0, run.err
    assert not _apt(run) and _started(run)


def test_a_missing_debootstrap_alone_is_installed_alone(machine: FakeMachine) -> None:
    machine.install("docker", "dockerd")
    run = machine.run(uid=0)
    assert run.code == 0, run.err
    assert _apt(run)[-1] == "apt-get install -y -qq debootstrap"


def test_a_dockerd_that_is_starting_already_is_waited_for_not_started_twice(
    machine: FakeMachine,
) -> None:
    machine.install("docker", "dockerd", "debootstrap")
    (machine.root / "dockerd-running").touch()
    (machine.root / "up").write_text("2")  # answers on the third `docker info`
    run = machine.run(uid=0)
    assert run.code == 0, run.err
    assert "starting already" in run.out and not _started(run)


def test_an_engine_that_never_answers_fails_after_the_deadline(machine: FakeMachine) -> None:
    machine.install("docker", "dockerd", "debootstrap")
    (machine.root / "dockerd.log").write_text("")
    run = machine.run(uid=0, up_after="never", ENGINE_DEADLINE="2")
    assert run.code == 1 and "did not answer within 2 s" in run.err


def test_not_root_on_debian_changes_nothing_and_says_what_to_run(machine: FakeMachine) -> None:
    run = machine.run(uid=1000)
    assert run.code == 1
    assert "sudo apt-get update && sudo apt-get install -y docker.io debootstrap" in run.err
    assert "sudo systemctl start docker" in run.err and "usermod -aG docker" in run.err
    assert "sudo make run" in run.err
    assert not _apt(run) and not _started(run)


def test_root_on_another_system_without_docker_says_what_to_install(
    machine: FakeMachine,
) -> None:
    machine.os_release.write_text(FEDORA)
    run = machine.run(uid=0)
    assert run.code == 1
    assert "install Docker Engine for your system" in run.err and "sudo" not in run.err
    assert not _apt(run) and not _started(run)


def test_root_on_another_system_with_dockerd_installed_starts_it(machine: FakeMachine) -> None:
    machine.os_release.write_text(FEDORA)
    machine.install("docker", "dockerd")
    run = machine.run(uid=0)
    assert run.code == 0, run.err
    assert not _apt(run) and _started(run)


def test_a_user_outside_the_docker_group_is_told_so(machine: FakeMachine) -> None:
    machine.install("docker", "dockerd", "debootstrap")
    (machine.root / "dockerd-running").touch()
    (machine.root / "denied").touch()
    run = machine.run(uid=1000)
    assert run.code == 1 and "may not use it" in run.err and "usermod -aG docker" in run.err
    assert not _started(run)


def test_a_dry_run_decides_but_does_nothing(machine: FakeMachine) -> None:
    run = machine.run(uid=0, ENGINE_DRY_RUN="1")
    assert run.code == 0, run.err
    install = "apt-get install -y -qq docker.io debootstrap"
    assert f"would run: env DEBIAN_FRONTEND=noninteractive {install}" in run.out
    assert "would run: nohup dockerd" in run.out
    assert not _apt(run) and not _started(run)


def test_ci_and_the_makefile_use_this_one_script() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    tiers = (ROOT / "scripts" / "setup-tiers.sh").read_text()
    # CI sets the engine up through setup-tiers.sh, which hands the engine to this script
    assert "scripts/setup-tiers.sh engine" in ci
    assert 'DOCKERD_CONFIG="${DOCKERD_CONFIG}" scripts/engine.sh' in tiers
    for text in (ci, tiers):  # no second copy of what this script does
        assert "nohup dockerd" not in text and "apt-get install docker" not in text
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")},
    ).stdout
    assert "scripts/engine.sh" in dry.splitlines()[0], "the engine comes first in `make run`"
    assert os.access(SCRIPT, os.X_OK)
