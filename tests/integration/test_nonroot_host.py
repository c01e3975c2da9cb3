"""A non-root host user (in the docker group) can drive a sandbox, egress included.

The kernel runs as uid 1000 in the container and creates the unix sockets; the host
user must still be able to connect to them.  Tests usually run as root, which would
hide a permission bug, so this test re-runs a small program as ``nobody``.
"""

from __future__ import annotations

import grp
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.integration

PROGRAM = """
import json
from kernel_sandbox.sync import Sandbox
with Sandbox.create(image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"}) as sb:
    sb.run_python("x = 6")
    out = sb.run_python("x * 7").text
    shell = sb.run_shell("id -un").stdout.strip()
# the egress proxy's socket, made by this user, must be reachable by the sandbox user
with Sandbox.create(
    image="kernel-sandbox:python", labels={"kernel-sandbox.test": "1"},
    network=["files.example.org"],
) as sb:
    code = "import urllib.request as u\\ntry:\\n    u.urlopen('https://outside.example.net/')\\n"
    egress = sb.run_python(code + "except Exception as e:\\n    print(e)").stdout
print(json.dumps({"result": out, "shell": shell, "egress": egress}))
"""


def _interpreter_for(uid: int) -> str | None:
    """An interpreter of the same minor version that ``uid`` may execute."""
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        path = Path(candidate)
        if not path.exists():
            continue
        try:
            probe = subprocess.run(
                [candidate, "-c", "print(1)"], user=uid, capture_output=True, check=False
            )
        except PermissionError:
            continue
        if probe.returncode == 0:
            return candidate
    return None


def _copy_dependencies(target: Path) -> None:
    """Copy kernel_sandbox and the third-party modules it loads where ``nobody`` can read."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, kernel_sandbox.sync, kernel_sandbox.backends.docker\n"
            "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    site = Path(sysconfig.get_paths()["purelib"])
    dists = importlib.metadata.packages_distributions()
    for name in loaded:
        for candidate in (site / name, site / f"{name}.py"):
            if candidate.is_dir():
                shutil.copytree(candidate, target / candidate.name, dirs_exist_ok=True)
            elif candidate.exists():
                shutil.copy2(candidate, target / candidate.name)
        for dist in [name, *dists.get(name, [])]:
            extras = [*site.glob(f"{dist.replace('-', '_')}-*.dist-info"), site / f"{dist}.libs"]
            for extra in extras:  # metadata, and the shared libraries that wheels vendor
                if extra.is_dir():
                    shutil.copytree(extra, target / extra.name, dirs_exist_ok=True)
    shutil.copytree(
        Path(__file__).parents[2] / "kernel_sandbox", target / "kernel_sandbox", dirs_exist_ok=True
    )


def test_non_root_host_user_can_use_a_sandbox(docker_engine) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    if os.getuid() != 0:  # already non-root: just run the program
        run = subprocess.run(
            [sys.executable, "-c", PROGRAM],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    else:
        nobody = 65534
        python = _interpreter_for(nobody)
        require(python is not None, "no Python interpreter that user 'nobody' may run")
        assert python is not None
        workdir = Path(tempfile.mkdtemp(prefix="ks-nonroot-"))
        try:
            os.chmod(workdir, 0o755)
            _copy_dependencies(workdir)
            for root, dirs, files in os.walk(workdir):
                for n in dirs + files:
                    os.chmod(os.path.join(root, n), 0o755)
            env.update(PYTHONPATH=str(workdir), HOME=str(workdir), PYTHONNOUSERSITE="1")
            env.pop("KERNEL_SANDBOX_RUNTIME_DIR", None)
            run = subprocess.run(
                [python, "-c", PROGRAM],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                user=nobody,
                group=nobody,
                extra_groups=[grp.getgrnam("docker").gr_gid],
                cwd=workdir,
                check=False,
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in ("result", "shell")} == {"result": "42", "shell": "sandbox"}
    assert "403 refused by the sandbox's network policy" in got["egress"], got["egress"]
