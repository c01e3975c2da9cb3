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


def _cli_install(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli.main", "kernelspec", "install",
         *options, "--prefix", str(tmp_path)],
        capture_output=True, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip


def test_cli_install_of_the_r_js_and_bash_kernels_says_their_language_and_image(
    tmp_path: Path,
) -> None:
    expected = {
        "ir": ("R", "kernel-sandbox:r", "R (sandbox kernel-sandbox:r)"),
        "deno": ("typescript", "kernel-sandbox:javascript", None),
        "bash": ("bash", "kernel-sandbox:polyglot", "Bash (sandbox kernel-sandbox:polyglot)"),
    }
    for kernel, (language, image, shown) in expected.items():
        done = _cli_install(tmp_path, "--kernel", kernel)
        assert done.returncode == 0, done.stderr
        path = tmp_path / f"share/jupyter/kernels/kernel-sandbox-{kernel}/kernel.json"
        spec = json.loads(path.read_text())
        sandbox = spec["metadata"]["kernel_provisioner"]["config"]["sandbox"]
        assert (spec["language"], sandbox["image"], sandbox["kernel"]) == (language, image, kernel)
        assert spec["interrupt_mode"] == "signal"  # the relay interrupts as the kernel asks
        assert shown is None or spec["display_name"] == shown
        assert SandboxConfig(**sandbox).network_enabled is False


def test_cli_install_of_a_custom_images_kernel_needs_its_image(tmp_path: Path) -> None:
    refused = _cli_install(tmp_path, "--kernel", "julia-1.10")
    assert refused.returncode == 2 and "--image" in refused.stderr
    done = _cli_install(
        tmp_path, "--kernel", "julia-1.10", "--image", "me/julia:1", "--language", "julia"
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads(
        (tmp_path / "share/jupyter/kernels/kernel-sandbox-julia-1.10/kernel.json").read_text()
    )
    assert spec["language"] == "julia" and spec["display_name"] == "julia-1.10 (sandbox me/julia:1)"
