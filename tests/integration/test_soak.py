"""Load / soak: thousands of checked calls on 20 sandboxes at once, nothing lost or leaked.

The normal suite runs a short form (2 000 calls); ``KS_SOAK_EXECUTIONS=10000`` (or
``make soak``) runs the full one.  Every call must come back with exactly its own
output, and the host process must not grow: RSS after warm-up, open file descriptors
and threads are bounded (resources, not timings).
"""

from __future__ import annotations

import os

import docker
import pytest

from bench.soak import run_soak, table
from tests.conftest import TEST_LABEL
from tests.integration.conftest import PYTHON_IMAGE

CALLS = int(os.environ.get("KS_SOAK_EXECUTIONS", "2000"))
SANDBOXES = int(os.environ.get("KS_SOAK_SANDBOXES", "20"))
#: RSS may grow this much between the end of warm-up and the end of the run.
RSS_GROWTH_BOUND_KB = 50 * 1024
#: Descriptors the second round may hold beyond the first: the engine client's
#: connection pool breathes by a few.  One leaked descriptor per sandbox exceeds it.
FD_SLACK = 8
THREAD_SLACK = 2


@pytest.mark.timeout(max(600, CALLS // 4))
async def test_soak_every_call_gets_its_own_result_and_nothing_leaks(
    docker_engine: docker.DockerClient,
) -> None:
    # a first round of the same width makes the lazily built clients, contexts and
    # connection pools, so the second shows what each sandbox and call leaves behind
    await run_soak(SANDBOXES, SANDBOXES, image=PYTHON_IMAGE, labels=TEST_LABEL)
    report = await run_soak(CALLS, SANDBOXES, image=PYTHON_IMAGE, labels=TEST_LABEL)
    print("\n" + table([(f"{SANDBOXES} sandboxes", report.row())]))

    assert report.lost == [], f"{len(report.lost)} lost, e.g. {report.lost[:3]}"
    assert report.misrouted == [], f"{len(report.misrouted)} misrouted: {report.misrouted[:3]}"
    assert report.duplicated == 0
    assert report.correct == CALLS
    assert set(report.kinds) == {"python", "shell", "file"}

    assert report.rss_growth_kb < RSS_GROWTH_BOUND_KB, report.rss
    # nothing accumulates per call while the sandboxes are open ...
    assert report.fds["end"] <= report.fds["warm"] + FD_SLACK, report.fds
    assert report.threads["end"] <= report.threads["warm"] + THREAD_SLACK, report.threads
    # ... nor per sandbox once they are closed
    assert report.fds["after"] <= report.fds["before"] + FD_SLACK, report.fds
    assert report.threads["after"] <= report.threads["before"] + THREAD_SLACK, report.threads
