"""``kernel-sandbox gc`` goes on past a leftover it cannot remove, and says so."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from kernel_sandbox.backends.base import Leftover
from kernel_sandbox.cli import admin
from kernel_sandbox.testing import LocalKernelHost


class WedgedHost(LocalKernelHost):
    """A host whose engine holds two leftovers, one of which cannot be removed."""

    removed: ClassVar[list[str]] = []

    @classmethod
    async def gc(cls, *, remove_all: bool = False) -> list[Leftover]:
        async def wedged() -> None:
            raise TimeoutError("the engine did not answer")

        async def fine() -> None:
            cls.removed.append("fine")

        return [Leftover("sandbox wedged", wedged), Leftover("sandbox fine", fine)]


def test_one_leftover_that_cannot_be_removed_does_not_keep_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admin, "host_class", lambda name: WedgedHost)

    result: Any = CliRunner().invoke(admin.gc, [])

    assert WedgedHost.removed == ["fine"]
    assert result.exit_code == 1
    assert "could not remove sandbox wedged: the engine did not answer" in result.output
    assert "1 leftover(s) removed, 1 could not be removed" in result.output


def test_an_unknown_host_is_named_with_the_known_ones() -> None:
    result: Any = CliRunner().invoke(admin.gc, ["--host", "nowhere"])
    assert result.exit_code != 0
    assert "no kernel host is named 'nowhere'" in str(result.exception)
    assert "docker" in str(result.exception) and "local" in str(result.exception)
