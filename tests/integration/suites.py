"""Run the Jupyter ecosystem's own test suites on a stock kernel and on ours, and compare.

A suite runs unmodified in a pytest of its own (its own configuration, pytest-timeout
so that a hang is a failure), once with the stock ``python3`` kernelspec and once with
ours installed *as* ``python3`` in a private ``JUPYTER_PATH`` (found before the stock
one), at the same time; a long one in shards, each a pytest of its own.  The outcome
of each test comes from the JUnit XML reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from kernel_sandbox.config import KERNEL_PYTHON

ROOT = Path(__file__).resolve().parents[2]
#: Label on every container a suite run makes, so the caller can prove all are gone.
LABEL = "kernel-sandbox.test-suites"
#: The pytest plugin that keeps one shard of a suite (``run_suite(shards=)``).
SHARD_PLUGIN = Path(__file__).resolve().parent / "suite_shard"


@dataclass(frozen=True)
class Outcomes:
    """Each test's outcome (passed, failed, error, skipped) and its failure text."""

    results: dict[str, str]
    messages: dict[str, str]

    @property
    def passed(self) -> set[str]:
        """The tests that passed."""
        return {name for name, what in self.results.items() if what == "passed"}

    def timed_out(self) -> set[str]:
        """The tests pytest-timeout stopped."""
        return {name for name, text in self.messages.items() if "Timeout" in text}


#: Where fetched suites are kept between runs.
CACHE = Path(os.environ.get("KS_SUITES_CACHE", "/tmp/ks-suites"))


def fetch_sdist(project: str, version: str, probe: str) -> Path:
    """``project`` ``version``'s source distribution (the package index's, by pip),
    unpacked in :data:`CACHE` once: the directory, in which ``probe`` must exist."""
    from tests.conftest import host_lock

    stem = f"{project.replace('-', '_')}-{version}"
    with host_lock(CACHE / f"{stem}.lock"):  # test workers may ask for it at once
        return _fetched(project, version, probe, stem)


def _fetched(project: str, version: str, probe: str, stem: str) -> Path:
    from tests.conftest import require

    where = CACHE / stem
    if (where / probe).exists():
        return where
    sdist = CACHE / f"{stem}.tar.gz"
    if not sdist.exists():
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"{project}=={version}", "-d", str(CACHE)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        require(sdist.exists(), f"cannot fetch {project} {version}'s sources: {got.stderr[-800:]}")
    with tarfile.open(sdist) as tar:
        tar.extractall(CACHE, filter="data")
    return where


def install_ours(
    where: Path, image: str, label: str, name: str = "python3", kernel: str = "python3"
) -> dict[str, str]:
    """Install our kernelspec (sandboxing the image's ``kernel``) as ``name`` under
    ``where``; the env that makes it found."""
    subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli.main", "kernelspec", "install",
         "--name", name, "--kernel", kernel, "--image", image, "--prefix", str(where)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, capture_output=True,
    )  # fmt: skip
    spec_file = where / "share" / "jupyter" / "kernels" / name / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["metadata"]["kernel_provisioner"]["config"]["sandbox"]["labels"] = {LABEL: label}
    spec_file.write_text(json.dumps(spec))
    return {"JUPYTER_PATH": str(where / "share" / "jupyter")}


def install_stock_in_image(where: Path, image: str, kernel: str, label: str) -> dict[str, str]:
    """The image's own kernelspec ``kernel`` as jupyter_client runs any kernelspec, with
    none of our code between: its ``argv`` and ``env`` (read from the image) in a plain
    ``docker run`` of the image on the host's network, so the kernel binds the ports
    jupyter_client picked, the connection file mounted; installed as ``kernel`` under
    ``where``.  The env that makes it found.  What a kernel does unsandboxed, for a
    kernel the host has no interpreter for (R, Deno)."""
    probe = (
        "import json; from jupyter_client.kernelspec import KernelSpecManager as M; "
        f"print(json.dumps(M().get_kernel_spec({kernel!r}).to_dict()))"
    )
    found = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", KERNEL_PYTHON,
         image, "-c", probe],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    spec = json.loads(found.stdout.strip().splitlines()[-1])
    env = [arg for k, v in spec.get("env", {}).items() for arg in ("-e", f"{k}={v}")]
    argv = [
        "docker", "run", "--rm", "-i", "--network", "host", "--user", "0:0",
        "--label", f"{LABEL}={label}", "-v", "{connection_file}:{connection_file}:ro",
        *env, "--entrypoint", spec["argv"][0], image, *spec["argv"][1:],
    ]  # fmt: skip
    folder = where / "share" / "jupyter" / "kernels" / kernel
    folder.mkdir(parents=True)
    stock = {k: spec[k] for k in ("display_name", "language", "interrupt_mode") if k in spec}
    (folder / "kernel.json").write_text(json.dumps({**stock, "argv": argv}))
    return {"JUPYTER_PATH": str(where / "share" / "jupyter")}


def run_suite(
    cwd: Path,
    args: list[str],
    envs: dict[str, dict[str, str]],
    timeout: float,
    shards: int = 1,
) -> dict[str, Outcomes]:
    """Run ``pytest args`` in ``cwd`` once per entry of ``envs``, all at once; each in
    ``shards`` pytests side by side (every ``shards``-th test each), their outcomes
    joined: a suite whose time goes to waiting on kernels ends sooner."""
    runs: dict[tuple[str, int], tuple[subprocess.Popen[bytes], Path]] = {}
    results: dict[str, Outcomes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, extra in envs.items():
                for shard in range(shards):
                    runs[name, shard] = _start(cwd, args, extra, Path(tmp), name, shard, shards)
            deadline = time.monotonic() + timeout
            for (name, shard), (proc, report) in runs.items():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(1.0, deadline - time.monotonic()))
                log = (Path(tmp) / f"{name}-{shard}.log").read_text(errors="replace")
                assert report.exists(), f"{name}: the suite left no report:\n{log[-3000:]}"
                part = parse_junit(report)
                whole = results.setdefault(name, Outcomes({}, {}))
                whole.results.update(part.results)
                whole.messages.update(part.messages)
        finally:  # the suites and their kernels end with the test, whatever happened
            for proc, _ in runs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results


def _start(
    cwd: Path, args: list[str], extra: dict[str, str], tmp: Path, name: str, shard: int, shards: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start shard ``shard`` of ``shards`` of the suite with the env ``extra``: the
    process and where its JUnit report will be."""
    report = tmp / f"{name}-{shard}.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("PYTEST_ADDOPTS", None)
    for variable in [v for v in env if v.startswith("PYTEST_XDIST_")]:
        del env[variable]  # the suite's pytest is not one of our xdist workers
    if shards > 1:
        plugins = [p for p in env.get("PYTEST_PLUGINS", "").split(",") if p]
        env["PYTEST_PLUGINS"] = ",".join([*plugins, "kernel_sandbox_suite_shard"])
        env["PYTHONPATH"] = f"{SHARD_PLUGIN}{os.pathsep}{env['PYTHONPATH']}"
        env["KERNEL_SANDBOX_SUITE_SHARD"] = f"{shard}/{shards}"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--junitxml={report}", *args]  # fmt: skip
    with open(tmp / f"{name}-{shard}.log", "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=out, start_new_session=True
        )
    return proc, report


def parse_junit(report: Path) -> Outcomes:
    """The outcomes in a JUnit XML report, by ``file::Class::test`` name."""
    results: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        what = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                what = child.tag
                messages[name] = f"{child.get('message', '')}\n{child.text or ''}"[:2000]
                break
        results[name] = what
    return Outcomes(results, messages)


def containers_left(label: str) -> list[str]:
    """Containers of a suite run still there (removed now: the caller fails on them)."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL}={label}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    left = out.stdout.split()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    return left


def compare(outcomes: dict[str, Outcomes]) -> str:
    """What a report of stock against ours says, for an assertion's message."""
    stock, ours = outcomes["stock"], outcomes["ours"]
    lost = sorted(stock.passed - ours.passed)
    lines = [f"stock {len(stock.passed)}/{len(stock.results)} passed, "
             f"ours {len(ours.passed)}/{len(ours.results)}"]  # fmt: skip
    for name in lost:
        lines.append(f"- {name}: {ours.results.get(name, 'missing')}")
        lines.append("  " + ours.messages.get(name, "").strip()[:600].replace("\n", "\n  "))
    return "\n".join(lines)
