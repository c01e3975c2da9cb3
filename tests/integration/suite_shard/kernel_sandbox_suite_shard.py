"""A pytest plugin for a suite run in shards: one shard's tests, the others deselected.

``KERNEL_SANDBOX_SUITE_SHARD="i/n"`` keeps every n-th collected test from the i-th (the
slow ones spread over the shards as they are over the file); each shard is a pytest of
its own (see :func:`tests.integration.suites.run_suite`), so the union of the shards'
reports is the whole suite, each test once.
"""

from __future__ import annotations

import os

import pytest

#: The environment variable naming this process's shard, "index/count".
SHARD_ENV = "KERNEL_SANDBOX_SUITE_SHARD"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    index, count = (int(part) for part in os.environ[SHARD_ENV].split("/"))
    drop = [item for n, item in enumerate(items) if n % count != index]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = items[index::count]
