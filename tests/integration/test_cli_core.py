"""CLI commands of the core: run, shell, ps, gc (orphans of a killed process)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from kernel_sandbox.cli.main import cli
from tests.integration.conftest import ORPHAN_MAKER, orphan_of_killed_owner

pytestmark = pytest.mark.integration


def test_run_prints_outputs_saves_images_and_fails_on_error(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = "print('hello')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
    ok = CliRunner().invoke(cli, ["run", "-c", code, "--save-images", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert "hello" in ok.output and (tmp_path / "output-1.png").read_bytes()[:4] == b"\x89PNG"
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('boom')")
    bad = CliRunner().invoke(cli, ["run", str(script), "--image", "kernel-sandbox:python"])
    assert bad.exit_code == 1 and "ValueError: boom" in bad.output


def test_shell_exits_with_the_command_status(docker_engine) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(
        cli, ["shell", "echo out; exit 3", "--image", "kernel-sandbox:python"]
    )
    assert result.exit_code == 3 and "out" in result.output


@pytest.mark.orphans  # gc
def test_gc_removes_sandboxes_whose_owner_was_killed(docker_engine) -> None:  # type: ignore[no-untyped-def]
    sandbox_id = orphan_of_killed_owner()
    label = f"kernel-sandbox.id={sandbox_id}"
    assert docker_engine.containers.list(all=True, filters={"label": label})
    listed = CliRunner().invoke(cli, ["ps"])
    assert sandbox_id in listed.output and "(gone)" in listed.output
    result = CliRunner().invoke(cli, ["gc"])
    assert result.exit_code == 0 and f"removing sandbox {sandbox_id}" in result.output
    assert not docker_engine.containers.list(all=True, filters={"label": label})


@pytest.mark.orphans  # gc
@pytest.mark.tcp_transport
def test_gc_removes_the_network_of_a_killed_owners_tcp_sandbox(docker_engine: object) -> None:
    sandbox_id = orphan_of_killed_owner(ORPHAN_MAKER.replace("labels=", 'transport="tcp", labels='))
    network = f"kernel-sandbox-{sandbox_id}"
    client: Any = docker_engine
    assert client.networks.list(names=[network])
    result = CliRunner().invoke(cli, ["gc"])
    assert f"removing network {network}" in result.output, result.output
    assert not client.networks.list(names=[network])
    label = f"kernel-sandbox.id={sandbox_id}"
    assert not client.containers.list(all=True, filters={"label": label})
