"""The stateful peers, raced in the same run: AutoGen's and smolagents' Docker executors.

Each peer is installed into its own bench-only virtualenv under
``~/.cache/kernel-sandbox-bench/`` (never a dependency of kernel_sandbox) and driven by
``driver.py`` with that virtualenv's Python.  Their images are built here without a
registry, the way ours are: their Dockerfiles' package lists on our debootstrap base
(``kernel-sandbox-base:bookworm``), from wheels the host's pip downloaded, installed
offline in the build (``python bench/peers/__init__.py`` builds both up front).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("KS_BENCH_CACHE", Path.home() / ".cache" / "kernel-sandbox-bench"))
BASE_IMAGE = "kernel-sandbox-base:bookworm"
#: peer -> (pip spec of the peer for its virtualenv, image tag, import check)
PEERS: dict[str, tuple[str, str, str]] = {
    "autogen": (
        "autogen-ext[docker-jupyter-executor]==0.7.5",
        "ks-bench-peer-autogen:0.7.5",
        "import autogen_ext.code_executors.docker_jupyter, docker",
    ),
    "smolagents": (
        "smolagents[docker]==1.26.0",
        "ks-bench-peer-smolagents:1.26.0",
        "import smolagents.remote_executors, docker, websocket",
    ),
}


def ensure_venv(peer: str) -> Path:
    """The peer's virtualenv Python; made on first use (needs the package index)."""
    spec, _, check = PEERS[peer]
    venv = CACHE / f"venv-{peer}"
    python = venv / "bin" / "python"
    works = python.exists() and subprocess.run([python, "-c", check], capture_output=True)
    if works and works.returncode == 0:
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip install {spec} failed:\n{done.stderr[-2000:]}")
    return python


def ensure_image(peer: str, progress: Any = None) -> str:
    """The peer's image, built offline on our debootstrap base when missing."""
    import docker

    from kernel_sandbox.backends.docker.images.builder import image_exists, run_build
    from kernel_sandbox.backends.docker.images.wheels import (
        build_context,
        complete_wheels,
        probe_python,
    )

    _, tag, _ = PEERS[peer]
    client = docker.from_env(timeout=600)
    if image_exists(client, tag):
        return tag
    if image_exists(client, BASE_IMAGE) is None:
        raise RuntimeError(f"{BASE_IMAGE} is missing: `kernel-sandbox images build --airgapped`")
    say = progress or (lambda line: print(line, file=sys.stderr))
    directory = HERE / peer
    requirements = [
        line.strip()
        for line in (directory / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    target = probe_python(client, BASE_IMAGE)
    wheels = complete_wheels(
        client, BASE_IMAGE, requirements, CACHE / "wheels" / f"{peer}-{target.key}", target, say
    )
    context = build_context(directory, extra_dirs={"wheels": wheels})
    run_build(
        context,
        tag=tag,
        progress=say,
        buildargs={"BASE_IMAGE": BASE_IMAGE},
        labels={"kernel-sandbox.bench": "1"},
        network_mode="none",
    )
    return tag


def measure(peer: str, starts: int, calls: int, idle: int) -> dict[str, Any]:
    """Run the driver for ``peer`` in its virtualenv; the JSON it printed."""
    python = ensure_venv(peer)
    image = ensure_image(peer)
    done = subprocess.run(
        [str(python), str(HERE / "driver.py"), peer, image, str(starts), str(calls), str(idle)],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # not the repo: the peer must not import our files
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{peer} driver failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["image"] = image
    result["version"] = PEERS[peer][0]
    return result


def measure_rl(peer: str, n: int, m: int, concurrency: int) -> dict[str, Any]:
    """bench/rl.py's workload on ``peer``: the driver's ``rl`` figures."""
    python = ensure_venv(peer)
    image = ensure_image(peer)
    command = [str(python), str(HERE / "driver.py"), "rl", peer, image]
    done = subprocess.run(
        [*command, str(n), str(m), str(concurrency)],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # not the repo: the peer must not import our files
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{peer} driver failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["image"] = image
    result["version"] = PEERS[peer][0]
    return result


def cleanup() -> None:
    """Remove containers a killed driver left behind (named ``ks-bench-peer-*``)."""
    names = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "name=ks-bench-peer-"], capture_output=True, text=True
    ).stdout.split()
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))
    for name in sys.argv[1:] or list(PEERS):
        print(ensure_venv(name), ensure_image(name))
