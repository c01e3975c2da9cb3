"""nbclient's own ``tests/test_client.py`` on our kernel and on stock, in the same run.

The suite comes from the nbclient release installed here: its source distribution is
fetched with pip into a cache (BSD-3-Clause, so copying would be allowed; fetching keeps
the repository free of it) and run unmodified, with its own configuration, once with
the stock ``python3`` kernelspec and once with ours installed *as* ``python3`` (the
notebooks ask for ``python``/``python3``).  Every test that passes on stock passes on
ours, and none hangs (pytest-timeout stops a hang: a failure), except those listed in
:data:`NOT_APPLICABLE`, each with why.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.suites import compare, containers_left, fetch_sdist, install_ours, run_suite

pytestmark = pytest.mark.integration

#: The image of our kernel: the datascience image has ipywidgets (the widget tests).
IMAGE = "kernel-sandbox:datascience"
#: Pytests per kernel, side by side: each test mostly waits for its kernels to start.
SHARDS = 2

#: Tests whose premise a sandbox refuses by design.
NOT_APPLICABLE = {
    "tests.test_client::test_async_parallel_notebooks": (
        "two kernels meet through a folder of the host named by a variable of the host's "
        "own environment (NBEXECUTE_TEST_PARALLEL_TMPDIR set in os.environ): sandboxes "
        "share no files, and the host's environment never reaches a sandbox "
        "(jupyter/client_request.py)."
    ),
    "tests.test_client::test_parallel_notebooks": (
        "the thread variant of the same premise: its notebooks fail on ours as in the "
        "async variant, and it passes or fails by timing alone: it joins its threads "
        "with a 2 s timeout, so a thread's error counts only when it comes within the "
        "test (pytest's unhandled-thread warning) — on a loaded host it does"
    ),
}
#: Tests whose expected output was written by an IPython other than the image's: they
#: pass on ours only where the host's IPython and the image's have the same major.
IPYTHON_VERSIONED = {
    "tests.test_client::test_run_all_notebooks[Skip Exceptions with Cell Tags.ipynb-opts8]": (
        "the notebook's saved traceback has IPython 8's two lines of context; IPython 9 "
        "prints the whole short cell (a stock ipykernel with IPython 9 does the same)"
    ),
}


def _ipython_major(argv: list[str]) -> str:
    out = subprocess.run(
        [*argv, "-c", "import IPython; print(IPython.version_info[0])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


@pytest.mark.timeout(1500)
def test_nbclient_suite_passes_as_on_stock(docker_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for module in ("testpath", "xmltodict", "flaky", "ipywidgets", "pytest_asyncio"):
        require(
            importlib.util.find_spec(module) is not None,
            f"{module} (nbclient's test dependencies) is missing: pip install -e '.[dev]'",
        )
    suite = fetch_sdist("nbclient", importlib.metadata.version("nbclient"), "tests/test_client.py")
    label = f"{os.getpid()}-{time.monotonic_ns()}"
    ours = install_ours(tmp_path / "ours", IMAGE, label)
    stock = {"JUPYTER_PATH": str(tmp_path / "empty")}
    outcomes = run_suite(
        suite,
        ["--timeout=120", "-p", "no:cov", "tests/test_client.py"],
        {"stock": stock, "ours": ours},
        timeout=1200,
        shards=SHARDS,
    )
    report = compare(outcomes)
    stock_passed, ours_passed = outcomes["stock"].passed, outcomes["ours"].passed
    assert len(stock_passed) >= 80, report  # the suite really ran
    assert outcomes["ours"].timed_out() == set(), report
    excused = set(NOT_APPLICABLE)
    image_ipython = _ipython_major(["docker", "run", "--rm", "--entrypoint", "python", IMAGE])
    if image_ipython != _ipython_major([sys.executable]):
        excused |= set(IPYTHON_VERSIONED)
    assert stock_passed - ours_passed - excused == set(), report
    assert containers_left(label) == []
