"""Image builder logic that needs no engine: targets, pip arguments, contexts, tags, caching."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest
from click.testing import CliRunner

from kernel_sandbox.backends.docker.images import (
    _kind,
    derived_tag,
    forget_resolved,
    resolve_kernel_image,
)
from kernel_sandbox.backends.docker.images import builder as builder_mod
from kernel_sandbox.backends.docker.images import wheels as wheels_mod
from kernel_sandbox.backends.docker.images.accounts import sandbox_account
from kernel_sandbox.backends.docker.images.builder import (
    IMAGE_SOURCE_LABEL,
    ImageBuilder,
    images_dir,
    source_digest,
)
from kernel_sandbox.backends.docker.images.confined import StepResult
from kernel_sandbox.backends.docker.images.derive import (
    DERIVED_FROM,
    KERNEL_LABEL,
    derive_dockerfile,
)
from kernel_sandbox.backends.docker.images.wheels import (
    PROBE,
    PythonTarget,
    build_context,
    complete_wheels,
    download_wheels,
    pip_download_args,
)
from kernel_sandbox.cli.main import cli
from kernel_sandbox.errors import ImageError, ImageNotFoundError

DEBIAN = PythonTarget(version=(3, 11, 2), machine="x86_64", libc="glibc", libc_version="2.36")


# --- the image's interpreter decides the wheels -------------------------------------------


def test_glibc_target_lists_every_manylinux_tag_it_can_load() -> None:
    platforms = DEBIAN.platforms()
    assert platforms[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_34_x86_64" in platforms  # debugpy's wheel needs glibc 2.34
    assert "manylinux_2_17_x86_64" in platforms
    assert platforms[-1] == "manylinux2014_x86_64"  # pip expands it to 2010 and manylinux1
    old = PythonTarget((3, 8, 10), "aarch64", "glibc", "2.12")
    assert old.platforms()[-1] == "manylinux2010_aarch64"
    assert "manylinux_2_17_aarch64" not in old.platforms()


def test_musl_and_unknown_libc_targets() -> None:
    assert PythonTarget((3, 12, 1), "x86_64", "musl").platforms() == [
        "musllinux_1_2_x86_64",
        "musllinux_1_1_x86_64",
    ]
    assert PythonTarget((3, 12, 1), "x86_64", "").platforms() == []


def test_pip_download_args_target_the_image_not_the_host() -> None:
    target = PythonTarget((3, 9, 18), "x86_64", "glibc", "2.31")
    args = pip_download_args(["ipykernel", "pip"], Path("/w"), target)
    assert args[:4] == ["-m", "pip", "download", "--only-binary=:all:"]
    assert args[args.index("--python-version") + 1] == "3.9.18"
    assert args[args.index("--abi") + 1] == "cp39"
    assert "manylinux_2_31_x86_64" in args and "manylinux_2_32_x86_64" not in args
    assert args[-2:] == ["ipykernel", "pip"]
    pure = pip_download_args(["x"], Path("/w"), PythonTarget((3, 11, 0), "x86_64", ""))
    assert pure[pure.index("--platform") + 1] == "any"


def test_target_key_and_problems() -> None:
    assert DEBIAN.key == "cp311-glibc2.36-x86_64"
    assert DEBIAN.problem() is None
    assert "3.8" in str(PythonTarget((3, 7, 9), "x86_64", "glibc", "2.28").problem())
    assert "venv" in str(
        PythonTarget((3, 11, 2), "x86_64", "glibc", "2.36", has_venv=False).problem()
    )
    assert "CPython" in str(
        PythonTarget((3, 10, 0), "x86_64", "glibc", "2.36", implementation="pypy").problem()
    )


def test_probe_script_describes_the_running_python() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["version"][:2] == list(sys.version_info[:2])
    assert info["has_venv"] is True
    assert info["machine"]


def test_probe_script_is_not_answered_by_a_module_in_its_working_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "json.py").write_text("import sys\nsys.stdout.write('{}')\nsys.exit(0)\n")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert json.loads(out.stdout)["version"][:2] == list(sys.version_info[:2])


def test_probe_says_whether_the_python_has_venv(tmp_path: Path) -> None:
    def probe(**env: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", PROBE],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **env},
        )
        return dict(json.loads(done.stdout))

    (tmp_path / "venv.py").write_text("raise ImportError('no venv in this Python')\n")
    assert probe()["has_venv"] is True
    assert probe(PYTHONPATH=str(tmp_path))["has_venv"] is False  # as Debian's without python3-venv


# --- the wheelhouse -----------------------------------------------------------------------


def test_complete_wheelhouse_is_used_offline(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ipykernel-7.0.0-py3-none-any.whl").write_bytes(b"")
    calls: list[list[str]] = []

    def fake_pip(argv: list[str], progress: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(wheels_mod, "_pip", fake_pip)
    lines: list[str] = []
    assert download_wheels(["ipykernel"], tmp_path, DEBIAN, lines.append) == tmp_path
    assert len(calls) == 1 and "--no-index" in calls[0]
    assert calls[0][calls[0].index("--find-links") + 1] == str(tmp_path)
    assert "no download needed" in lines[-1]


def test_failed_download_says_what_to_check(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def fake_pip(argv: list[str], progress: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "ERROR: No matching distribution", "")

    monkeypatch.setattr(wheels_mod, "_pip", fake_pip)
    with pytest.raises(ImageError, match=r"(?s)No matching distribution.*copy the wheels"):
        download_wheels(["nothere"], tmp_path / "w", DEBIAN, lambda _: None)


# --- build contexts -----------------------------------------------------------------------


def test_build_context_adds_extras_without_touching_the_source(tmp_path: Path) -> None:
    source = images_dir() / "python"
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "tiny-1.0-py3-none-any.whl").write_bytes(b"PK")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    context = build_context(
        source,
        extra_dirs={"build-extras/wheels": wheels},
        extra_files={"build-extras/ca.pem": ca, "extra.txt": b"hello"},
    )
    with tarfile.open(fileobj=context) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(members["extra.txt"]).read() == b"hello"  # type: ignore[union-attr]
    for name in (
        "./Dockerfile",
        "./requirements.txt",
        "./build-extras/wheels/.keep",
        "build-extras/wheels/tiny-1.0-py3-none-any.whl",
        "build-extras/ca.pem",
    ):
        assert name in members, sorted(members)
    assert all(m.uid == 0 for m in members.values())
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before


def test_dockerfiles_stay_plain_for_registry_users() -> None:
    for name, base in (("python", "python:3.11-slim"), ("datascience", "kernel-sandbox:python")):
        text = (images_dir() / name / "Dockerfile").read_text()
        assert text.index(f"ARG BASE_IMAGE={base}") < text.index("FROM ${BASE_IMAGE}")
        # `docker build images/NAME` must work: build-extras/ must exist in the context
        assert (images_dir() / name / "build-extras" / "wheels" / ".keep").is_file()
    assert (
        'kernel-sandbox.kernel-python="/opt/venv/bin/python"'
        in (images_dir() / "python" / "Dockerfile").read_text()
    )


def test_images_dir_can_be_pointed_elsewhere(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KERNEL_SANDBOX_IMAGES", str(tmp_path))
    with pytest.raises(ImageError, match="KERNEL_SANDBOX_IMAGES"):
        images_dir()


# --- build plans and the registry-less base -----------------------------------------------


def test_plan_puts_what_an_image_needs_first() -> None:
    builder = ImageBuilder(repository="ks-test")
    assert builder.plan(["datascience"]) == ["python", "datascience"]
    assert builder.plan(["python", "datascience"]) == ["python", "datascience"]
    assert builder.plan(["standin"]) == ["base", "standin"]
    assert builder.tag("datascience") == "ks-test:datascience"
    assert builder.tag("standin") == "python:3.11-slim"
    with pytest.raises(ImageError, match="known: python, datascience"):
        builder.plan(["gpu"])


def test_an_images_source_digest_follows_its_files_and_its_parents(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    for name in ("python", "datascience", "r"):
        (tmp_path / name / "build-extras" / "wheels").mkdir(parents=True)
        (tmp_path / name / "Dockerfile").write_text(f"FROM x\n# {name}\n")
    monkeypatch.setenv("KERNEL_SANDBOX_IMAGES", str(tmp_path))
    before = {name: source_digest(name) for name in ("python", "datascience", "r")}
    (tmp_path / "python" / "build-extras" / "wheels" / "a.whl").write_bytes(b"PK")
    assert {name: source_digest(name) for name in before} == before  # the builder's extras
    (tmp_path / "datascience" / "requirements.txt").write_text("numpy\n")
    assert source_digest("datascience") != before["datascience"]
    assert source_digest("python") == before["python"]
    (tmp_path / "python" / "Dockerfile").write_text("FROM x\nRUN apt-get install git\n")
    assert source_digest("python") != before["python"]
    assert source_digest("r") != before["r"]  # built on python: built again too


def test_an_image_built_from_other_source_is_built_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    labels = {"ks-test:python": {IMAGE_SOURCE_LABEL: source_digest("python")}}
    labels["ks-test:datascience"] = {IMAGE_SOURCE_LABEL: "an older one"}
    monkeypatch.setattr(
        builder_mod,
        "image_exists",
        lambda client, tag: {"Id": tag, "Config": {"Labels": labels[tag]}},
    )
    built: list[str] = []
    monkeypatch.setattr(
        ImageBuilder, "build_from_dir", lambda self, name: built.append(name) or name
    )
    said: list[str] = []
    builder = ImageBuilder(repository="ks-test", progress=said.append)
    builder._client = object()  # type: ignore[assignment]
    reports = builder.build(["datascience"])
    assert [(r.tag, r.action) for r in reports] == [
        ("ks-test:python", "present"),
        ("ks-test:datascience", "built"),
    ]
    assert built == ["datascience"]
    assert "ks-test:datascience was built from other source: rebuilding it" in " ".join(said)


def test_base_needs_root_and_debootstrap(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(builder_mod.os, "geteuid", lambda: 1000)
    with pytest.raises(ImageError, match="needs root"):
        ImageBuilder().make_base()
    monkeypatch.setattr(builder_mod.os, "geteuid", lambda: 0)
    monkeypatch.setattr(builder_mod.shutil, "which", lambda _: None)
    with pytest.raises(ImageError, match="apt-get install -y debootstrap"):
        ImageBuilder().make_base()


# --- derived images -----------------------------------------------------------------------


def test_derived_tag_is_keyed_by_the_source_image_id() -> None:
    assert derived_tag("sha256:" + "ab" * 32) == "kernel-sandbox-derived:" + "ab" * 6


SOURCE_ID = "sha256:" + "12" * 32


def test_derive_dockerfile_keeps_the_images_environment_and_runs_nothing() -> None:
    labels = {KERNEL_LABEL: "/opt/venv/bin/python", DERIVED_FROM: SOURCE_ID}
    account = sandbox_account(None, None)
    text = derive_dockerfile(
        SOURCE_ID, account, ["PATH=/custom/bin:/usr/bin", "LANG=de_DE"], labels
    )
    assert text.count(f"FROM {SOURCE_ID}") == 1
    assert "RUN" not in text  # nothing of the image runs while the derived image builds
    assert "ADD ks/venv.tar /" in text
    assert "COPY --chown=1000:1000 ks/empty/ /sandbox/" in text
    assert 'PATH="/opt/venv/bin:/custom/bin:/usr/bin"' in text
    assert "LANG=C.UTF-8" not in text  # the image's own LANG wins
    assert "ENTRYPOINT []" in text  # an image's entrypoint would wrap the kernel
    assert f'{KERNEL_LABEL}="/opt/venv/bin/python"' in text
    bare = derive_dockerfile(SOURCE_ID, account, [], {})
    assert "/usr/local/bin:/usr/sbin" in bare and "LANG=C.UTF-8" in bare


@pytest.mark.parametrize(
    "env",
    [['PATH=/x"\nRUN evil'], ["PATH=/bin\nADD http://127.0.0.1/ /"], ["PATH=$(evil)"]],
)
def test_an_images_hostile_path_never_reaches_the_dockerfile(env: list[str]) -> None:
    text = derive_dockerfile(SOURCE_ID, sandbox_account(None, None), env, {})
    assert "evil" not in text and "http" not in text and text.count("\n") == 12
    with pytest.raises(ImageError, match="not an image id"):
        derive_dockerfile("img\nRUN evil", sandbox_account(None, None), [], {})


def test_sandbox_account_skips_taken_ids_and_keeps_an_existing_user() -> None:
    passwd = b"root:x:0:0:root:/root:/bin/sh\nappuser:x:1000:1000::/home/app:/bin/sh\n"
    group = b"root:x:0:\nappuser:x:1000:\n"
    account = sandbox_account(passwd, group)
    assert (account.uid, account.gid, account.home) == (1001, 1001, "/home/sandbox")
    assert account.passwd.endswith(b"sandbox:x:1001:1001::/home/sandbox:/bin/sh\n")
    assert account.group.endswith(b"sandbox:x:1001:\n")
    kept = sandbox_account(b"sandbox:x:1500:1600::/srv/sb:/bin/sh", b"")
    assert (kept.uid, kept.gid, kept.home) == (1500, 1600, "/srv/sb")
    hostile = sandbox_account(b"sandbox:x:7:7::/../../etc:/bin/sh", b"")
    assert hostile.home == "/home/sandbox"


GOOD_PROBE = {
    "version": [3, 11, 2],
    "implementation": "cpython",
    "machine": "x86_64",
    "libc": "glibc",
    "libc_version": "2.36",
    "executable": "/usr/bin/python3",
    "has_venv": True,
}


def test_a_sound_probe_answer_is_taken() -> None:
    target = PythonTarget.from_probe(GOOD_PROBE, "img")
    assert target.key == "cp311-glibc2.36-x86_64"
    assert target.executable == "/usr/bin/python3"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("libc_version", "2.1000000"),
        ("libc_version", "../../../tmp/x"),
        ("executable", "python3"),
        ("executable", '/usr/bin/python3"]\nRUN ["sh'),
        ("executable", "/usr/../../bin/sh"),
        ("machine", "x86/../../y"),
        ("version", [3, 11]),
        ("version", [3, 11, "2"]),
        ("version", [3, 10**9, 0]),
        ("has_venv", "yes"),
        ("implementation", "c" * 100),
    ],
)
def test_a_malformed_probe_answer_is_refused(field: str, value: object) -> None:
    with pytest.raises(ImageError, match=f"does not accept.*{field}"):
        PythonTarget.from_probe({**GOOD_PROBE, field: value}, "img")
    with pytest.raises(ImageError):
        PythonTarget.from_probe(["not", "a", "dict"], "img")


class _FakeAPI:
    def __init__(self, images: dict[str, dict[str, Any]]) -> None:
        self.images = images
        self.inspected: list[str] = []

    def inspect_image(self, ref: str) -> dict[str, Any]:
        self.inspected.append(ref)
        if ref not in self.images:
            raise docker.errors.ImageNotFound(f"no such image: {ref}")
        return self.images[ref]


def _fake_engine(monkeypatch, images: dict[str, dict[str, Any]]) -> SimpleNamespace:  # type: ignore[no-untyped-def]
    pulls: list[str] = []

    def pull(repository: str, tag: str | None = None) -> None:
        pulls.append(f"{repository}:{tag}")
        raise docker.errors.APIError("no registry here")

    client = SimpleNamespace(api=_FakeAPI(images), images=SimpleNamespace(pull=pull), pulls=pulls)
    for module in ("derive", "builder"):
        monkeypatch.setattr(
            f"kernel_sandbox.backends.docker.images.{module}.docker_client", lambda: client
        )
    forget_resolved()
    return client


def test_resolution_is_remembered_for_the_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ready = {"Id": "sha256:1", "Config": {"Labels": {KERNEL_LABEL: "/opt/venv/bin/python"}}}
    plain = {"Id": "sha256:2", "Config": {"Labels": None}}
    client = _fake_engine(monkeypatch, {"mine:1": ready, "plain:1": plain})
    for _ in range(3):
        assert asyncio.run(resolve_kernel_image("mine:1", derive=True)) == "mine:1"
    assert client.api.inspected == ["mine:1"]  # one engine call, then the cache
    # without derive, an image without the label is started as it is
    assert asyncio.run(resolve_kernel_image("plain:1", derive=False)) == "plain:1"
    forget_resolved()


def test_missing_images_say_how_to_get_them(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    client = _fake_engine(monkeypatch, {})
    with pytest.raises(ImageNotFoundError, match="kernel-sandbox images build"):
        asyncio.run(resolve_kernel_image("kernel-sandbox:gpu", derive=True))
    assert client.pulls == []  # ours are never on a registry
    with pytest.raises(ImageNotFoundError, match=r"pull it .*pulling failed: no registry"):
        asyncio.run(resolve_kernel_image("someone/app", derive=True))
    assert client.pulls == ["someone/app:latest"]
    forget_resolved()


def test_list_kinds() -> None:
    assert _kind("kernel-sandbox:python", {KERNEL_LABEL: "x"}) == "sandbox"
    assert _kind("kernel-sandbox-derived:abc", {KERNEL_LABEL: "x", DERIVED_FROM: "y"}) == "derived"
    assert _kind("my-team:1", {KERNEL_LABEL: "x"}) == "custom"
    assert _kind("kernel-sandbox-base:bookworm", {}) == "base"
    assert _kind("python:3.11-slim", {"kernel-sandbox.standin": "made"}) == "stand-in"
    assert _kind("python:3.11-slim", {}) == "python base"


# --- CLI ----------------------------------------------------------------------------------


def test_cli_help_and_bad_names() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["images", "build", "--help"])
    assert result.exit_code == 0
    for option in ("--force", "--airgapped", "--pip-cert", "--quiet", "standin"):
        assert option in result.output
    assert runner.invoke(cli, ["images", "list", "--help"]).exit_code == 0
    bad = runner.invoke(cli, ["images", "build", "gpu"])
    assert bad.exit_code == 2 and "gpu" in bad.output


# --- wheels for an image whose Python differs from the host's -----------------------------


def test_same_python_as_the_host_needs_no_check_in_the_image(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import platform

    monkeypatch.setattr(wheels_mod, "download_wheels", lambda *a: tmp_path)
    host = PythonTarget((*sys.version_info[:3],), platform.machine(), "glibc", "2.36")  # type: ignore[arg-type]
    untouchable = SimpleNamespace()  # any engine call would raise AttributeError
    assert complete_wheels(untouchable, "img", ["x"], tmp_path, host, print) == tmp_path  # type: ignore[arg-type]


def test_what_the_images_pip_misses_is_downloaded_until_nothing_is(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # pip on the host skips `typing-extensions; python_version < "3.10"` for a 3.9 image
    (tmp_path / "pip-26.0-py3-none-any.whl").write_bytes(b"PK")
    outputs = iter(
        [
            (
                1,
                "ERROR: No matching distribution found for typing-extensions; "
                'python_version < "3.10"',
            ),
            (1, "ERROR: No matching distribution found for exceptiongroup>=1.0"),
            (0, "Successfully downloaded ipykernel"),
        ]
    )
    argvs: list[list[str]] = []

    def fake_run(  # the confined step that runs the image's pip (an engine call)
        client: Any, image: str, python: str, argv: list[str], files: Any, **options: Any
    ) -> StepResult:
        argvs.append([python, *argv])
        with tarfile.open(fileobj=files) as tar:
            assert "ks-check/w/pip-26.0-py3-none-any.whl" in tar.getnames()
        return StepResult(*next(outputs))

    downloaded: list[list[str]] = []
    monkeypatch.setattr(wheels_mod, "download_wheels", lambda *a: tmp_path)
    monkeypatch.setattr(wheels_mod, "run_with_files", fake_run)
    monkeypatch.setattr(wheels_mod, "_download", lambda reqs, *a: downloaded.append(reqs))
    py39 = PythonTarget((3, 9, 2), "x86_64", "glibc", "2.31", executable="/usr/bin/python3")
    complete_wheels(None, "img", ["ipykernel"], tmp_path, py39, lambda _: None)  # type: ignore[arg-type]
    assert downloaded == [["typing-extensions"], ["exceptiongroup>=1.0"]]
    assert argvs[0][:2] == ["/usr/bin/python3", "/tmp/ks-check/pip-26.0-py3-none-any.whl/pip"]
    assert "--no-index" in argvs[0] and argvs[0][-1] == "ipykernel"
