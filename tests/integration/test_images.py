"""Images on the real engine: custom images, derived images, clear errors, the CLI.

Images a test builds carry the test label and are removed by that test; the derived
image of python:3.11-slim is a shared cache and stays.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import pytest
from click.testing import CliRunner

from kernel_sandbox.backends.docker.images import (
    STANDIN_TAG,
    forget_resolved,
    list_images,
    make_standin_image,
    resolve_kernel_image,
)
from kernel_sandbox.backends.docker.images.builder import BASE_TAG, image_exists
from kernel_sandbox.backends.docker.images.confined import Confinement, run_confined
from kernel_sandbox.backends.docker.images.derive import DERIVED_FROM, KERNEL_LABEL, derive_image
from kernel_sandbox.cli.main import cli
from kernel_sandbox.errors import ImageError, ImageNotFoundError
from tests.conftest import IN_CI, require

pytestmark = pytest.mark.integration
# Not the test *container* label: a build's intermediate containers inherit the labels
# of the image they run, and other test sessions remove containers carrying that one.
IMAGE_LABEL = {"kernel-sandbox.test-image": "1"}


def _tiny_wheel(directory: Path) -> Path:
    """A pure-Python wheel, written by hand: the package a custom image installs."""
    files = {
        "tinygreet/__init__.py": b"def greet(name):\n    return f'hello {name} from tinygreet'\n",
        "tinygreet-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinygreet\n"
        b"Version: 1.0\n",
        "tinygreet-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinygreet-1.0.dist-info/RECORD,,")
    path = directory / "tinygreet-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("tinygreet-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def test_images(docker_engine) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """Tags to remove after the test, in this order (derived images before their source)."""
    tags: list[str] = []
    yield tags
    forget_resolved()
    for tag in tags:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_engine.images.remove(tag, force=True)


def _build(client, directory: Path, tag: str) -> None:  # type: ignore[no-untyped-def]
    client.images.build(
        path=str(directory), tag=tag, labels=IMAGE_LABEL, network_mode="none", forcerm=True
    )


@pytest.fixture(scope="module")
def standin(docker_engine) -> str:  # type: ignore[no-untyped-def]
    """The plain python:3.11-slim (no ipykernel); made from the base when missing."""
    if image_exists(docker_engine, STANDIN_TAG) is None:
        require(
            image_exists(docker_engine, BASE_TAG) is not None,
            f"{STANDIN_TAG} and {BASE_TAG} missing: run `kernel-sandbox images build standin` "
            "as root",
        )
        import asyncio

        asyncio.run(make_standin_image())
    return STANDIN_TAG


async def test_custom_image_from_python_image_runs_its_package(
    make_sandbox, docker_engine, test_images, tmp_path: Path
) -> None:
    # The air-gapped recipe of docs/how-to/custom-images.md: wheels from the host,
    # installed with --no-index.
    (tmp_path / "wheels").mkdir()
    _tiny_wheel(tmp_path / "wheels")
    (tmp_path / "Dockerfile").write_text(
        "FROM kernel-sandbox:python\n"
        "USER root\n"
        "COPY wheels/ /tmp/wheels/\n"
        "RUN pip install --no-index --find-links /tmp/wheels tinygreet && rm -rf /tmp/wheels\n"
        "USER sandbox\n"
    )
    tag = "kernel-sandbox-test-custom:1"
    test_images.append(tag)
    _build(docker_engine, tmp_path, tag)

    assert await resolve_kernel_image(tag, derive=True) == tag  # kernel-ready: label inherited
    sandbox = await make_sandbox(image=tag)
    assert sandbox.image == tag
    result = await sandbox.run_python("import tinygreet\ntinygreet.greet('agent')")
    assert result.status == "ok", result.text
    assert "hello agent from tinygreet" in result.text


async def test_plain_python_image_is_derived_once_and_keeps_state(make_sandbox, standin) -> None:
    sandbox = await make_sandbox(image=standin)
    assert sandbox.image.startswith("kernel-sandbox-derived:")
    await sandbox.run_python("x = 41")
    result = await sandbox.run_python("import sys, os\n(x + 1, sys.prefix, os.getcwd())")
    assert result.status == "ok", result.text
    assert "(42, '/opt/venv', '/sandbox')" in result.text
    again = await make_sandbox(image=standin)  # remembered: same image, no second build
    assert again.image == sandbox.image


async def test_derived_image_sees_the_images_packages_and_avoids_taken_uid(
    make_sandbox, docker_engine, test_images, standin, tmp_path: Path
) -> None:
    # An image whose uid 1000 is taken, with a system-wide module and a non-root USER.
    (tmp_path / "Dockerfile").write_text(
        f"FROM {standin}\n"
        "RUN useradd --uid 1000 --create-home appuser && "
        "echo 'VALUE = 7' > /usr/lib/python3/dist-packages/ks_plain_module.py\n"
        "USER appuser\n"
    )
    tag = "kernel-sandbox-test-plain:1"
    _build(docker_engine, tmp_path, tag)
    test_images.append(tag)
    lines: list[str] = []
    derived = derive_image(tag, progress=lines.append)
    test_images.insert(0, derived)
    labels = docker_engine.images.get(derived).labels
    assert labels[KERNEL_LABEL] == "/opt/venv/bin/python"
    assert labels[DERIVED_FROM] == docker_engine.images.get(tag).id
    assert any("deriving a kernel-ready image" in line for line in lines)  # progress shown

    sandbox = await make_sandbox(image=tag)
    assert sandbox.image == derived
    await sandbox.run_python("x = 5")
    result = await sandbox.run_python(
        "import os, pwd, ks_plain_module\n"
        "(x + ks_plain_module.VALUE, pwd.getpwuid(os.getuid()).pw_name, os.getuid())"
    )
    assert result.status == "ok", result.text
    assert "(12, 'sandbox', 1001)" in result.text
    shell = await sandbox.run_shell("pip --version && id -un")
    assert "/opt/venv" in shell.stdout and "sandbox" in shell.stdout  # pip installs go to the venv


async def test_image_without_python_gets_a_clear_error(
    make_sandbox, docker_engine, test_images
) -> None:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (
            ("Dockerfile", b"FROM scratch\nCOPY hello.txt /\n"),
            ("hello.txt", b"hi"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    tag = "kernel-sandbox-test-nopython:1"
    docker_engine.images.build(
        fileobj=context, custom_context=True, tag=tag, labels=IMAGE_LABEL, forcerm=True
    )
    test_images.append(tag)
    with pytest.raises(ImageError, match=r"has no usable Python.*CPython >= 3.8"):
        await make_sandbox(image=tag)
    left = docker_engine.containers.list(all=True, filters={"label": "kernel-sandbox.probe=1"})
    assert not [c for c in left if c.image.tags == [tag]]  # probe containers are removed


async def test_missing_image_says_build_or_pull(docker_engine) -> None:
    with pytest.raises(ImageNotFoundError, match="kernel-sandbox images build"):
        await resolve_kernel_image("kernel-sandbox:no-such-flavour", derive=True)
    with pytest.raises(ImageNotFoundError, match="pull it"):
        await resolve_kernel_image("kernel-sandbox-test/no-such-image:1", derive=True)


async def test_list_shows_ours_and_derived(docker_engine, standin) -> None:
    await resolve_kernel_image(standin, derive=True)
    listing = await list_images()
    kinds = {image.tag: image.kind for image in listing.images}
    assert kinds["kernel-sandbox:python"] == kinds["kernel-sandbox:datascience"] == "sandbox"
    assert "derived" in kinds.values()
    assert listing.missing == []


def test_cli_build_has_nothing_to_do_when_present_and_list_shows_it(docker_engine) -> None:
    runner = CliRunner()
    built = runner.invoke(cli, ["images", "build", "--quiet"])
    assert built.exit_code == 0, built.output
    assert built.output.count("nothing to do") == 2
    listed = runner.invoke(cli, ["images", "list"])
    assert listed.exit_code == 0, listed.output
    assert "kernel-sandbox:datascience" in listed.output and "missing" not in listed.output
    # and which runtimes the engine offers (CI registers gVisor's)
    runtimes = listed.output.splitlines()[-1]
    assert runtimes.startswith("engine runtimes: ") and "runc" in runtimes, runtimes
    if IN_CI:
        assert "runsc (gVisor: runtime='runsc')" in runtimes, runtimes


def test_an_images_step_past_the_sandboxs_memory_is_stopped_and_says_so(
    docker_engine, standin: str
) -> None:  # type: ignore[no-untyped-def]
    """A probe or venv build runs under the memory its sandbox would have: one that
    needs more is killed there, and the error names the sandbox's limit."""
    limits = Confinement.of(None, 96 * 1024**2, 256, 1.0)
    grow = "b = bytearray(b'x') * (300 * 1024**2); print(len(b))"
    step = run_confined(docker_engine, standin, ["python3", "-c", grow], timeout=60, limits=limits)
    assert step.code != 0, step
    assert step.stopped.startswith("it ran out of memory: 96 MiB, the sandbox's memory_limit")
    fits = run_confined(
        docker_engine, standin, ["python3", "-c", "print(len(bytearray(b'x') * 2**20))"],
        timeout=60, limits=limits,
    )  # fmt: skip
    assert (fits.code, fits.stopped, fits.output.strip()) == (0, "", "1048576"), fits
