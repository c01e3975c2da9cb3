"""``kernel-sandbox gc`` goes on past a leftover it cannot remove, and says so."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from kernel_sandbox.cli import admin


def test_one_leftover_that_cannot_be_removed_does_not_keep_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    removed: list[str] = []

    def wedged() -> None:
        raise TimeoutError("the engine did not answer")

    leftovers = [
        admin._Leftover("sandbox wedged", wedged),
        admin._Leftover("sandbox fine", lambda: removed.append("fine")),
    ]
    monkeypatch.setattr(admin, "DockerBackend", lambda: None)
    monkeypatch.setattr(admin, "_sandboxes", lambda: [])
    monkeypatch.setattr(admin, "_orphan_containers", lambda *a: leftovers)
    monkeypatch.setattr(admin, "_orphan_volumes", lambda *a: [])
    monkeypatch.setattr(admin, "_orphan_networks", lambda *a: [])
    monkeypatch.setattr(admin, "_stale_run_dirs", lambda *a: [])

    result: Any = CliRunner().invoke(admin.gc, [])

    assert removed == ["fine"]
    assert result.exit_code == 1
    assert "could not remove sandbox wedged: the engine did not answer" in result.output
    assert "1 leftover(s) removed, 1 could not be removed" in result.output
