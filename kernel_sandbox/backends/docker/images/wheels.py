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

from ....errors import ImageError
from ....kernel.programs import program
from ....limits import IMAGE_DERIVE_SECONDS, IMAGE_PROBE_SECONDS
from .confined import Confinement, StepResult, run_confined

__all__ = [
    "PROBE",
    "Progress",
    "PythonTarget",
    "build_context",
    "complete_wheels",
    "download_wheels",
    "pip_download_args",
    "probe_python",
    "run_with_files",
    "wheel_cache_dir",
]

log = logging.getLogger("kernel_sandbox.images")

#: Receives one line of build progress at a time.
Progress = Callable[[str], None]

#: Describes an image's Python as JSON (``programs/probe.py``; runs on Python 2.7 too).
PROBE = program("probe.py")
PYTHON_CANDIDATES = ("python3", "python")
MIN_PYTHON = (3, 8)
# What a probe answer may hold (a path, a directory name and a command line use them).
_PROBE_EXECUTABLE = re.compile(r"^/[A-Za-z0-9._+/-]{1,200}$")
_PROBE_LIBC_VERSION = re.compile(r"^(?:\d{1,2}\.\d{1,2}(?:\.\d{1,2})?)?$")
_PROBE_LIBC = re.compile(r"^[a-z]{0,16}$")
_PROBE_MACHINE = re.compile(r"^[A-Za-z0-9_]{1,20}$")
_PROBE_WORD = re.compile(r"^[a-z]{1,20}$")


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

    @classmethod
    def from_probe(cls, info: Any, image: str) -> PythonTarget:
        """The probe's JSON answer, checked field by field; ImageError when malformed.

        The answer comes from the image's own code, and its fields end up in a path
        (the wheelhouse) and a command line: each must be short, of safe characters,
        and mean what it claims (a version of three small numbers, an absolute path
        for the executable, a dotted number for the C library's version).
        """
        problems: list[str] = []

        def field(key: str, pattern: re.Pattern[str], default: str = "") -> str:
            value = info.get(key, default) if isinstance(info, dict) else None
            value = default if value is None else value
            if not isinstance(value, str) or not pattern.fullmatch(value):
                problems.append(f"{key}={str(value)[:60]!r}")
                return default
            return value

        version = info.get("version") if isinstance(info, dict) else None
        if not (
            isinstance(version, list)
            and len(version) == 3
            and all(type(v) is int and 0 <= v < 1000 for v in version)
        ):
            problems.append(f"version={str(version)[:60]!r}")
            version = [0, 0, 0]
        libc = field("libc", _PROBE_LIBC)
        has_venv = info.get("has_venv") if isinstance(info, dict) else None
        if not isinstance(has_venv, bool):
            problems.append(f"has_venv={str(has_venv)[:60]!r}")
        target = cls(
            version=(version[0], version[1], version[2]),
            machine=field("machine", _PROBE_MACHINE),
            libc=libc,
            libc_version=field("libc_version", _PROBE_LIBC_VERSION),
            implementation=field("implementation", _PROBE_WORD),
            executable=field("executable", _PROBE_EXECUTABLE),
            has_venv=bool(has_venv),
        )
        if problems or ".." in target.executable.split("/"):
            raise ImageError(
                f"image {image!r} described its Python with values kernel-sandbox does not "
                f"accept ({', '.join(problems) or 'executable'}); it cannot be derived"
            )
        return target

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
    limits: Confinement | None = None,
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
        missing = _missing_in_image(client, image, requirements, dest, target, progress, limits)
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
    limits: Confinement | None = None,
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
    argv = [pip, "download", "--no-index", "--find-links", "/tmp/ks-check/w"]
    argv += ["-d", "/tmp/ks-check/d", "--no-cache-dir", "--disable-pip-version-check", *args]
    step = run_with_files(client, image, target.executable, argv, archive, limits=limits)
    if step.code == 0:
        return None
    match = _NOT_FOUND.search(step.output)
    if match is None:
        why = step.stopped or step.output[-2000:]
        raise ImageError(f"checking the wheels in image {image!r} failed:\n{why}")
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


def probe_python(
    client: docker.DockerClient,
    image: str,
    name: str | None = None,
    limits: Confinement | None = None,
) -> PythonTarget:
    """Run the image's Python once, confined, and describe it; ImageError if none works.

    ``name`` is how the image is called in the error message (``image`` may be an id).
    The answer is the image's, so it is checked as data (:meth:`PythonTarget.from_probe`)
    before anything uses it.  ``limits`` are its sandboxes' runtime and limits.
    """
    tried: list[str] = []
    for candidate in PYTHON_CANDIDATES:
        step = run_confined(
            client, image, [candidate, "-c", PROBE], timeout=IMAGE_PROBE_SECONDS, limits=limits
        )
        out = step.output
        if step.code != 0:
            why = step.stopped or out.strip()[-300:] or f"exit status {step.code}"
            tried.append(f"`{candidate}`: {why}")
            continue
        try:
            info: Any = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tried.append(f"`{candidate}` printed no description: {out.strip()[-200:]!r}")
            continue
        return PythonTarget.from_probe(info, name or image)
    raise ImageError(
        f"image {name or image!r} has no usable Python ({'; '.join(tried)}). kernel-sandbox needs "
        "CPython >= 3.8 with the venv module on the PATH as `python3` or `python`; "
        "use an image that has one, or build FROM kernel-sandbox:python."
    )


#: Unpacks the tar on stdin into /tmp, then runs the rest of the command line (runs
#: in the image with its own Python, 3.8 too; the tar is the host's, never the image's).
UNPACK_THEN_RUN = (
    "import os, sys, tarfile\n"
    "t = tarfile.open(fileobj=sys.stdin.buffer, mode='r|')\n"
    "t.extractall('/tmp', **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))\n"
    "t.close()\n"
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])\n"
)


def run_with_files(
    client: docker.DockerClient,
    image: str,
    python: str,
    argv: list[str],
    files: IO[bytes],
    **options: Any,
) -> StepResult:
    """Run ``python argv...`` confined in ``image`` after unpacking ``files`` into /tmp."""
    with files:
        return run_confined(
            client,
            image,
            [python, "-c", UNPACK_THEN_RUN, *argv],
            stdin=files,
            timeout=options.pop("timeout", IMAGE_DERIVE_SECONDS),
            **options,
        )


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
