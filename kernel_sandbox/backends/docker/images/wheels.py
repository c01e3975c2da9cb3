"""Wheels from the host, build contexts assembled in a temporary tar.

Images are built without network inside the build: the host's pip (which knows the
site's index, proxy and CA) downloads binary wheels for the *image's* interpreter, and
the build installs them with ``--no-index``.  The image's interpreter is found by a
probe container, so the host's Python version does not leak into the image.
"""

from __future__ import annotations

import io
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors

from ....errors import ImageError
from ....kernel.programs import program

__all__ = [
    "PROBE",
    "Progress",
    "PythonTarget",
    "build_context",
    "complete_wheels",
    "download_wheels",
    "pip_download_args",
    "probe_python",
    "wheel_cache_dir",
]

log = logging.getLogger("kernel_sandbox.images")

#: Receives one line of build progress at a time.
Progress = Callable[[str], None]

#: Describes an image's Python as JSON (``programs/probe.py``; runs on Python 2.7 too).
PROBE = program("probe.py")
PYTHON_CANDIDATES = ("python3", "python")
MIN_PYTHON = (3, 8)


@dataclass(frozen=True)
class PythonTarget:
    """The interpreter inside an image, as far as wheel tags care."""

    version: tuple[int, int, int]
    machine: str
    libc: str
    libc_version: str = ""
    implementation: str = "cpython"
    executable: str = "python3"
    has_venv: bool = True

    @property
    def key(self) -> str:
        """A directory name for this target's wheelhouse, e.g. ``cp311-glibc2.36-x86_64``."""
        libc = f"{self.libc}{self.libc_version}" if self.libc else "nolibc"
        return f"cp{self.version[0]}{self.version[1]}-{libc}-{self.machine}"

    def problem(self) -> str | None:
        """Why a kernel cannot be installed for this interpreter, or None."""
        if self.implementation != "cpython":
            return f"the image's Python is {self.implementation}; kernel-sandbox needs CPython"
        if self.version[:2] < MIN_PYTHON:
            have = ".".join(map(str, self.version))
            return f"the image's Python is {have}; kernel-sandbox needs Python >= 3.8"
        if not self.has_venv:
            return "the image's Python has no `venv` module (on Debian: install python3-venv)"
        return None

    def platforms(self) -> list[str]:
        """pip ``--platform`` tags this image can load, newest first."""
        arch = self.machine
        if self.libc == "glibc" and self.libc_version:
            major, minor = (int(x) for x in self.libc_version.split(".")[:2])
            tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
            # pip expands a legacy alias to the older ones (2014 -> 2010 -> manylinux1).
            for legacy, since in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
                if minor >= since:
                    return [*tags, f"{legacy}_{arch}"]
            return tags
        if self.libc == "musl":
            return [f"musllinux_1_2_{arch}", f"musllinux_1_1_{arch}"]
        return []  # unknown C library: pure-Python wheels only


def pip_download_args(requirements: Iterable[str], dest: Path, target: PythonTarget) -> list[str]:
    """The ``pip download`` argument list for ``target`` (without the interpreter)."""
    version = ".".join(map(str, target.version))
    abi = f"cp{target.version[0]}{target.version[1]}"
    args = ["-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest)]
    args += ["--python-version", version, "--implementation", "cp", "--abi", abi]
    platforms = target.platforms()
    if platforms:
        for platform in platforms:
            args += ["--platform", platform]
    else:
        args += ["--platform", "any", "--abi", "none"]
    return [*args, *requirements]


def wheel_cache_dir() -> Path:
    """Where host-downloaded wheels are kept between builds (``$KERNEL_SANDBOX_CACHE``)."""
    root = os.environ.get("KERNEL_SANDBOX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernel-sandbox"
    )
    return Path(root) / "wheels"


def download_wheels(
    requirements: list[str], dest: Path, target: PythonTarget, progress: Progress
) -> Path:
    """Fill ``dest`` with wheels for ``requirements``; offline when it already has them.

    A wheelhouse that already satisfies the requirements is used as it is, so repeated
    builds (and sites without any index, where the wheels were copied in by hand) need
    no network.  Delete the directory to refresh it.
    """
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, *pip_download_args(requirements, dest, target)]
    offline = [*base[:4], "--no-index", "--find-links", str(dest), *base[4:]]
    if any(dest.glob("*.whl")) and _pip(offline, None).returncode == 0:
        progress(f"wheels: {dest} is complete, no download needed")
        return dest
    _download(requirements, dest, target, progress)
    return dest


def _download(
    requirements: list[str], dest: Path, target: PythonTarget, progress: Progress
) -> None:
    progress(f"wheels: downloading {' '.join(requirements)} for {target.key} into {dest}")
    result = _pip([sys.executable, *pip_download_args(requirements, dest, target)], progress)
    if result.returncode != 0:
        raise ImageError(
            f"the host's pip could not download wheels for {target.key}:\n"
            f"{result.stdout[-2000:]}\nCheck the host's pip configuration (index, proxy, "
            f"`cert`), or copy the wheels into {dest} by hand; see docs/how-to/air-gapped.md."
        )


def complete_wheels(
    client: docker.DockerClient,
    image: str,
    requirements: list[str],
    dest: Path,
    target: PythonTarget,
    progress: Progress,
) -> Path:
    """:func:`download_wheels`, then make sure the image's own pip finds everything.

    pip on the host evaluates environment markers (``python_version < "3.10"``) for the
    host's Python even when told the target's version.  When the image's Python differs
    from the host's, the image's pip resolves the requirements offline against the
    wheelhouse, and what it misses is downloaded by the host, until nothing is missing.
    """
    download_wheels(requirements, dest, target, progress)
    if sys.version_info[:2] == target.version[:2] and platform.machine() == target.machine:
        return dest
    for _ in range(12):
        missing = _missing_in_image(client, image, requirements, dest, target, progress)
        if missing is None:
            return dest
        progress(f"wheels: the image's Python also needs {missing}")
        _download([missing], dest, target, progress)
    raise ImageError(f"could not complete the wheelhouse {dest} for image {image!r}")


_NOT_FOUND = re.compile(r"No matching distribution found for ([^;\s]+)")


def _missing_in_image(
    client: docker.DockerClient,
    image: str,
    requirements: list[str],
    dest: Path,
    target: PythonTarget,
    progress: Progress,
) -> str | None:
    """The first requirement the image's pip cannot find in ``dest``, or None."""
    pip_wheels = sorted(dest.glob("pip-*.whl"))
    if not pip_wheels:  # pip runs from its wheel; fetch one for the image's Python
        pip_dir = download_wheels(
            ["pip"], wheel_cache_dir() / f"pip-{target.key}", target, progress
        )
        pip_wheels = sorted(pip_dir.glob("pip-*.whl"))
    files: dict[str, bytes | Path] = {f"ks-check/{pip_wheels[-1].name}": pip_wheels[-1]}
    args = list(requirements)
    for i, arg in enumerate(args[:-1]):
        if arg in ("-r", "--requirement"):  # the file goes into the container too
            files["ks-check/requirements.txt"] = Path(args[i + 1])
            args[i + 1] = "/tmp/ks-check/requirements.txt"
    archive = build_context(extra_dirs={"ks-check/w": dest}, extra_files=files)
    pip = f"/tmp/ks-check/{pip_wheels[-1].name}/pip"
    argv = [target.executable, pip, "download", "--no-index", "--find-links", "/tmp/ks-check/w"]
    argv += ["-d", "/tmp/ks-check/d", "--no-cache-dir", "--disable-pip-version-check", *args]
    code, out = _run_once(client, image, argv, archive=archive)
    if code == 0:
        return None
    match = _NOT_FOUND.search(out)
    if match is None:
        raise ImageError(f"checking the wheels in image {image!r} failed:\n{out[-2000:]}")
    return match.group(1)


def _pip(argv: list[str], progress: Progress | None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if progress and line.startswith(("Saved", "Collecting", "ERROR")):
            progress("  " + line.rstrip())
    code = proc.wait()
    return subprocess.CompletedProcess(argv, code, "".join(lines), "")


def probe_python(client: docker.DockerClient, image: str, name: str | None = None) -> PythonTarget:
    """Run the image's Python once (no network) and describe it; ImageError if none works.

    ``name`` is how the image is called in the error message (``image`` may be an id).
    """
    tried: list[str] = []
    for candidate in PYTHON_CANDIDATES:
        code, out = _run_once(client, image, [candidate, "-c", PROBE])
        if code is None or code != 0:
            tried.append(f"`{candidate}`: {out.strip()[-300:] or f'exit status {code}'}")
            continue
        try:
            info: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tried.append(f"`{candidate}` printed no description: {out.strip()[-200:]}")
            continue
        return PythonTarget(
            version=tuple(info["version"]),
            machine=str(info["machine"]),
            libc="glibc" if info["libc"] == "glibc" else str(info["libc"] or ""),
            libc_version=str(info["libc_version"] or ""),
            implementation=str(info["implementation"]),
            executable=str(info["executable"]),
            has_venv=bool(info["has_venv"]),
        )
    raise ImageError(
        f"image {name or image!r} has no usable Python ({'; '.join(tried)}). kernel-sandbox needs "
        "CPython >= 3.8 with the venv module on the PATH as `python3` or `python`; "
        "use an image that has one, or build FROM kernel-sandbox:python."
    )


def _run_once(
    client: docker.DockerClient, image: str, argv: list[str], archive: IO[bytes] | None = None
) -> tuple[int | None, str]:
    """Run ``argv`` as root without network; (exit code or None if it never ran, output).

    ``archive`` (a tar) is unpacked into /tmp of the container first.

    The low-level API, so that a container whose command cannot start is removed too.
    """
    api = client.api
    container = api.create_container(
        image,
        command=argv[1:],
        entrypoint=argv[:1],
        user="0",
        network_disabled=True,
        labels={"kernel-sandbox.probe": "1"},
        host_config=api.create_host_config(network_mode="none"),
    )
    try:
        if archive is not None:
            with archive:
                api.put_archive(container, "/tmp", archive.read())
        try:
            api.start(container)
        except docker.errors.APIError as exc:  # e.g. executable file not found
            return None, str(exc.explanation or exc)
        code = int(api.wait(container, timeout=120)["StatusCode"])
        return code, api.logs(container, stdout=True, stderr=True).decode(errors="replace")
    finally:
        api.remove_container(container, force=True)


def build_context(
    dockerfile_dir: Path | None = None,
    *,
    extra_dirs: Mapping[str, Path] | None = None,
    extra_files: Mapping[str, bytes | Path] | None = None,
) -> IO[bytes]:
    """A temporary tar build context: ``dockerfile_dir``'s files plus extras.

    ``extra_dirs`` maps a path in the context to a host directory (its files are added
    flat, e.g. ``build-extras/wheels``); ``extra_files`` maps a path to bytes or a file.
    Nothing is written next to the Dockerfile, so the source tree stays clean.
    """
    # Returned open (the caller streams it to the engine), so no context manager here.
    spool: IO[bytes] = tempfile.TemporaryFile(prefix="kernel-sandbox-context-")  # noqa: SIM115
    with tarfile.open(fileobj=spool, mode="w") as tar:
        if dockerfile_dir is not None:
            tar.add(str(dockerfile_dir), arcname=".", filter=_normalise)
        for arcdir, host_dir in (extra_dirs or {}).items():
            for path in sorted(host_dir.iterdir()):
                if path.is_file():
                    tar.add(str(path), arcname=f"{arcdir}/{path.name}", filter=_normalise)
        for arcname, content in (extra_files or {}).items():
            data = content.read_bytes() if isinstance(content, Path) else content
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    spool.seek(0)
    return spool


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Owner and times of the host files do not belong in the image (and break caching).
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info
