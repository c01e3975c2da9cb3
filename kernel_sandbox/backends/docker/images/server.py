"""The server image (``kernel-sandbox:server``): ``kernel-sandbox serve`` for a cluster.

Built like the kernel images, without an index inside the build: the host makes
kernel-sandbox's own wheel from the source checkout this module runs from (pip,
``--no-build-isolation``, offline) and downloads its dependencies' wheels for the image's
Python into the wheel cache; ``images/server/Dockerfile`` installs them ``--no-index``,
the dependencies in a layer of their own (cached by the engine while they are the same),
then the one wheel of ours.

The image is labelled with a digest of the package source and ``pyproject.toml``, so a
build is skipped while the code is unchanged and redone when it changed (a cluster must
not run an older server than the tests and docs describe).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ....config import LABEL_PREFIX
from ....errors import ImageError
from .engine_build import images_dir, run_build
from .wheels import (
    PythonTarget,
    build_context,
    complete_wheels,
    probe_python,
    wheel_cache_dir,
)

if TYPE_CHECKING:
    from .builder import ImageBuilder

__all__ = [
    "SOURCE_LABEL",
    "build_server_image",
    "dependencies",
    "server_is_current",
    "source_digest",
]

#: Label of the server image: the digest of the source it was built from.
SOURCE_LABEL = f"{LABEL_PREFIX}.source-digest"


def source_root() -> Path:
    """The checkout kernel_sandbox runs from (it has ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[4]
    if not (root / "pyproject.toml").is_file() or not (root / "kernel_sandbox").is_dir():
        raise ImageError(
            f"the server image is built from a source checkout of kernel-sandbox, and {root} "
            "is not one (no pyproject.toml): run from a git clone, or build your own image "
            "with `pip install kernel-sandbox` (see docs/how-to/kubernetes.md)"
        )
    return root


def _source_files(root: Path) -> list[Path]:
    package = root / "kernel_sandbox"
    files = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted([root / "pyproject.toml", root / "README.md", *files])


def source_digest(root: Path | None = None) -> str:
    """sha256 over the names and bytes of what goes into kernel-sandbox's wheel."""
    root = root or source_root()
    digest = hashlib.sha256()
    for path in _source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def server_is_current(labels: dict[str, str] | None) -> bool:
    """True when an image's labels say it was built from the source as it is now."""
    return bool(labels) and labels.get(SOURCE_LABEL) == source_digest()  # type: ignore[union-attr]


def _own_wheel(root: Path, dest: Path) -> Path:
    """Build kernel-sandbox's wheel from a clean copy of the source into ``dest``."""
    with tempfile.TemporaryDirectory(prefix="kernel-sandbox-wheel-") as tmp:
        copy = Path(tmp) / "src"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, copy / name)
        shutil.copytree(
            root / "kernel_sandbox",
            copy / "kernel_sandbox",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        for old in dest.glob("kernel_sandbox-*.whl"):
            old.unlink()  # the wheelhouse keeps dependencies; our own wheel is rebuilt
        base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check"]
        base += ["-q", "-w", str(dest), str(copy)]
        # offline with the host's setuptools and wheel when it has both; else pip gets
        # the build requirements from the host's index (in an isolated environment)
        result = subprocess.run(
            [*base, "--no-build-isolation"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            result = subprocess.run(base, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ImageError(f"building kernel-sandbox's wheel failed:\n{result.stderr[-2000:]}")
    found = sorted(dest.glob("kernel_sandbox-*.whl"))
    if not found:
        raise ImageError(f"pip wheel left no kernel_sandbox wheel in {dest}")
    return found[-1]


#: The extras the server image installs: the server itself, on the kubernetes host.
SERVER_EXTRAS = ("server", "kubernetes")


def dependencies(root: Path, extras: tuple[str, ...] = SERVER_EXTRAS) -> list[str]:
    """kernel-sandbox's requirements with ``extras``, as pip reads them.

    The core (``[project] dependencies``), then each extra's requirements in order; an
    extra that names another of ours (``kernel-sandbox[client]``) brings that one's, so
    the list holds only third-party requirements, each once.
    """
    with (root / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    name = project.get("name", "kernel-sandbox")
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    found: list[str] = [str(req) for req in project.get("dependencies", [])]
    seen: set[str] = set()

    def add(extra: str) -> None:  # depth first: an included extra where it is named
        if extra in seen:
            return
        seen.add(extra)
        for req in optional.get(extra, []):
            own = req.split("[", 1)
            if own[0].strip() == name and len(own) == 2:
                for included in own[1].split("]", 1)[0].split(","):
                    add(included.strip())
            elif req not in found:
                found.append(req)

    for extra in extras:
        add(extra)
    return found


def _wheelhouse_digest(requirements: list[str], deps: Path, target: PythonTarget) -> str:
    """A digest of ``requirements``, ``target`` and the wheelhouse's file names and sizes."""
    digest = hashlib.sha256(f"{target.key}\0{requirements}".encode())
    for path in sorted(deps.glob("*.whl")):
        digest.update(f"\0{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()


def _complete_once(
    builder: ImageBuilder, base: str, requirements: list[str], deps: Path, target: PythonTarget
) -> None:
    """:func:`complete_wheels`, skipped when the same wheelhouse was found complete for
    the same requirements before (pip's offline resolve of ~90 wheels takes seconds).

    The record is a file beside the wheelhouse (inside, it would enter the build context
    and undo the engine's cache of the dependencies' layer)."""
    deps.mkdir(parents=True, exist_ok=True)
    stamp = deps.with_name(f"{deps.name}.complete")
    with contextlib.suppress(OSError):
        if stamp.read_text() == _wheelhouse_digest(requirements, deps, target):
            builder.progress(f"wheels: {deps} was complete for these requirements")
            return
    complete_wheels(builder.client, base, requirements, deps, target, builder.progress)
    stamp.write_text(_wheelhouse_digest(requirements, deps, target))


def build_server_image(builder: ImageBuilder, tag: str) -> str:
    """Build ``images/server/Dockerfile`` on our python image; return the image id.

    The dependencies' wheelhouse (downloaded once, then checked offline) and our own
    wheel are made side by side; they enter the build as two directories, so the
    engine's cache keeps the dependencies' layer while only the source changes.
    """
    root = source_root()
    digest = source_digest(root)
    base = builder.tag("python")
    target = probe_python(builder.client, base)
    own = wheel_cache_dir() / f"server-own-{target.key}"
    own.mkdir(parents=True, exist_ok=True)
    deps = wheel_cache_dir() / f"server-{target.key}"
    requirements = dependencies(root)
    with ThreadPoolExecutor(max_workers=1) as pool:  # two pip runs at once
        wheel_job = pool.submit(_own_wheel, root, own)
        _complete_once(builder, base, requirements, deps, target)
        wheel = wheel_job.result()
    builder.progress(f"server: built {wheel.name} from {root}")
    for stale in deps.glob("kernel_sandbox-*.whl"):  # an older layout kept ours there
        stale.unlink()
    context = build_context(
        images_dir() / "server",
        extra_dirs={"build-extras/deps/wheels": deps, "build-extras/own": own},
        extra_files={"build-extras/deps/requirements.txt": "\n".join(requirements).encode()},
    )
    return run_build(
        context,
        tag=tag,
        progress=builder.progress,
        buildargs={"BASE_IMAGE": base, "PIP_INSTALL_ARGS": "--no-index"},
        labels={SOURCE_LABEL: digest},
        network_mode="none",
    )
