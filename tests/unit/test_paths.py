"""Paths given to a sandbox: resolved against its working directory, NUL bytes refused."""

from __future__ import annotations

import pytest

from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import FileOperationError
from kernel_sandbox.sandbox import AsyncSandbox


def make() -> AsyncSandbox:
    """A Docker sandbox that is never started (no engine call is made)."""
    config = SandboxConfig()
    return AsyncSandbox(config, DockerHost("unit", config), "unit")


def test_relative_and_dotted_paths_resolve_inside_the_working_dir() -> None:
    sandbox = make()
    assert sandbox.resolve_path("notes.txt") == "/sandbox/notes.txt"
    assert sandbox.resolve_path("../../etc//passwd") == "/etc/passwd"


@pytest.mark.parametrize("path", ["a\0b", "/etc/hostname\0.txt", "\0"])
def test_a_nul_byte_is_a_clear_error(path: str) -> None:
    with pytest.raises(FileOperationError, match="NUL byte"):
        make().resolve_path(path)
