"""The server image's bookkeeping: the source digest on its label, its requirements, and
the record that spares a rebuild pip's offline check of an unchanged wheelhouse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox.backends.docker.images import server
from kernel_sandbox.backends.docker.images.wheels import PythonTarget


def _tree(root: Path) -> Path:
    (root / "kernel_sandbox" / "__pycache__").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "kernel-sandbox"\ndependencies = ["click>=8.1"]\n'
        "[project.optional-dependencies]\n"
        'client = ["httpx2>=2.16"]\n'
        'server = ["kernel-sandbox[client]", "mcp>=2.3,<3"]\n'
        'kubernetes = ["kubernetes>=28", "httpx2>=2.16"]\n'
        'agent = ["openai>=1.40"]\n'
    )
    (root / "README.md").write_text("readme\n")
    (root / "kernel_sandbox" / "a.py").write_text("A = 1\n")
    return root


def test_the_digest_follows_the_source_and_ignores_bytecode(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    first = server.source_digest(root)
    (root / "kernel_sandbox" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert server.source_digest(root) == first
    (root / "kernel_sandbox" / "a.py").write_text("A = 2\n")
    assert server.source_digest(root) != first
    (root / "kernel_sandbox" / "a.py").write_text("A = 1\n")
    (root / "README.md").write_text("other\n")  # the wheel's metadata carries it
    assert server.source_digest(root) != first


def test_an_image_is_current_only_with_this_sources_digest() -> None:
    assert not server.server_is_current(None)
    assert not server.server_is_current({server.SOURCE_LABEL: "0" * 64})
    assert server.server_is_current({server.SOURCE_LABEL: server.source_digest()})


def test_the_requirements_are_the_core_and_the_servers_extras(tmp_path: Path) -> None:
    # the server's extras with the one they name (client), each requirement once,
    # and nothing of the extras the server does not need (agent)
    assert server.dependencies(_tree(tmp_path)) == [
        "click>=8.1",
        "httpx2>=2.16",
        "mcp>=2.3,<3",
        "kubernetes>=28",
    ]


def test_the_wheelhouse_check_runs_again_only_when_something_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[list[str]] = []

    def complete(client: Any, image: str, requirements: list[str], dest: Path, *_: Any) -> Path:
        checks.append(list(requirements))
        return dest

    class Builder:
        client = None

        def progress(self, line: str) -> None:
            pass

    monkeypatch.setattr(server, "complete_wheels", complete)
    target = PythonTarget((3, 11, 7), "x86_64", "glibc", "2.36", "CPython", "python3", True)
    deps = tmp_path / "server-wheels"
    once = [Builder(), "img", ["click>=8.1"], deps, target]
    server._complete_once(*once)  # type: ignore[arg-type]
    server._complete_once(*once)  # type: ignore[arg-type]
    assert len(checks) == 1
    assert not [p for p in deps.iterdir() if not p.name.endswith(".whl")]  # not in the context
    (deps / "click-8.1.0-py3-none-any.whl").write_bytes(b"wheel")
    server._complete_once(*once)  # type: ignore[arg-type]
    server._complete_once(Builder(), "img", ["click>=8.2"], deps, target)  # type: ignore[arg-type]
    assert checks == [["click>=8.1"], ["click>=8.1"], ["click>=8.2"]]
