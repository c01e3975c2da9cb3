"""Kernelspecs for sandboxed kernels: secure defaults, a refusing argv, install/remove."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.jupyter import PROVISIONER_NAME, install_kernelspec, kernelspec_json
from kernel_sandbox.jupyter.refuse import MESSAGE


def test_spec_names_the_provisioner_with_secure_defaults() -> None:
    spec = kernelspec_json(SandboxConfig(image="kernel-sandbox:python"))
    prov = spec["metadata"]["kernel_provisioner"]
    assert prov["provisioner_name"] == PROVISIONER_NAME
    config = SandboxConfig(**prov["config"]["sandbox"])
    assert config.network_enabled is False
    assert config.user != "root"
    assert config.memory_limit and config.cpu_limit
    assert spec["interrupt_mode"] == "signal"


def test_argv_refuses_to_run_a_kernel_here() -> None:
    argv = kernelspec_json(SandboxConfig())["argv"]
    done = subprocess.run(
        [a.replace("{connection_file}", "/nonexistent.json") for a in argv],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 1 and MESSAGE in done.stderr


def test_install_into_a_prefix_and_reject_bad_names(tmp_path: Path) -> None:
    where = install_kernelspec(
        "my-sandbox", SandboxConfig(memory_limit="512m"), prefix=str(tmp_path)
    )
    spec = json.loads((where / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["sandbox"]["memory_limit"] == "512m"
    assert where.parent == tmp_path / "share" / "jupyter" / "kernels"
    with pytest.raises(ConfigError):
        install_kernelspec("../evil", SandboxConfig(), prefix=str(tmp_path))


def test_cli_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli.main", "kernelspec", "install",
         "--name", "ks-cli", "--image", "kernel-sandbox:datascience", "--prefix", str(tmp_path)],
        capture_output=True, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "share/jupyter/kernels/ks-cli/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["sandbox"]["image"] == (
        "kernel-sandbox:datascience"
    )
