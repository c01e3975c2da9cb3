"""Build kernel-sandbox's images from ``images/``, with or without a registry.

``kernel-sandbox:python`` is built from ``images/python`` on ``python:3.11-slim``; when
that image can be neither found nor pulled (air-gapped sites), or with ``airgapped``,
a Debian base is made with debootstrap instead.  ``kernel-sandbox:datascience`` is
built on ``kernel-sandbox:python``.  pip never needs the network inside a build:
wheels are downloaded by the host's pip (see :mod:`.wheels`).  Each of our images is
labelled with a digest of its source (:func:`source_digest`); one whose label differs
(its Dockerfile changed, or a parent's did) is built again by ``build``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors

from ....config import LABEL_PREFIX
from ....errors import ImageError
from ..engine import docker_client
from .engine_build import build_client, image_exists, images_dir, run_build
from .npm import DENO_PACKAGE, npm_pack
from .server import build_server_image, server_is_current
from .wheels import Progress, build_context, complete_wheels, probe_python, wheel_cache_dir

__all__ = [
    "BASE_TAG",
    "IMAGE_NAMES",
    "IMAGE_SOURCE_LABEL",
    "STANDIN_TAG",
    "BuildReport",
    "ImageBuilder",
    "image_exists",
    "images_dir",
    "run_build",
    "source_digest",
]

log = logging.getLogger("kernel_sandbox.images")

REPOSITORY = "kernel-sandbox"
#: The registry-less base: Debian made by debootstrap, with Python, venv and pip.
BASE_TAG = "kernel-sandbox-base:bookworm"
#: Upstream base of kernel-sandbox:python, and the name of the stand-in we can make.
STANDIN_TAG = "python:3.11-slim"
STANDIN_LABEL = f"{LABEL_PREFIX}.standin"
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = "python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Our images in build order, each with the image it is built on.
IMAGE_NAMES: dict[str, str | None] = {
    "python": None,
    "datascience": "python",
    "r": "python",
    "javascript": "python",
    "polyglot": "r",
}
#: The label that says from what source (``images/NAME`` and its parents') an image was built.
IMAGE_SOURCE_LABEL = f"{LABEL_PREFIX}.image-source"
#: What ``build`` builds when given no names: the default sandbox image and its parent.
DEFAULT_IMAGES = ("python", "datascience")
#: Images whose build installs Debian packages (apt over plain HTTP, signed lists: the
#: build gets a network); every other build runs with none.
APT_IMAGES = frozenset({"python", "r"})
#: npm packages the host fetches into an image's build context (see :mod:`.npm`).
NPM_PACKAGES = {"javascript": (DENO_PACKAGE,), "polyglot": (DENO_PACKAGE,)}
#: Names ``build`` accepts besides our images (``server``: ``kernel-sandbox serve`` for a
#: cluster, on our python image; see ``server.py``).
HELPER_NAMES = ("base", "standin", "server")
#: What a helper is built on, when it is one of ours.
HELPER_PARENTS = {"server": "python"}
PipMode = Literal["host", "build"]


def source_digest(name: str) -> str:
    """A digest of ``images/NAME``'s files (the builder's ``build-extras`` aside) and of
    its parent's source: it changes when the image, or one it is built on, would build
    differently."""
    digest = hashlib.sha256()
    parent = IMAGE_NAMES[name]
    if parent is not None:
        digest.update(source_digest(parent).encode())
    directory = images_dir() / name
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and relative.parts[0] != "build-extras":
            digest.update(f"\0{relative}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class BuildReport:
    """What ``build`` did for one image: ``built`` or ``present`` (nothing to do)."""

    tag: str
    action: Literal["built", "present"]
    image_id: str
    seconds: float = 0.0


class ImageBuilder:
    """Builds what is missing (or everything named, with ``force``), in order.

    ``repository`` and ``base_tag`` exist so that a from-scratch build can go into
    other tags than the ones in use (benchmarks, tests).
    """

    def __init__(
        self,
        *,
        force: bool = False,
        airgapped: bool = False,
        pip: PipMode = "host",
        pip_cert: Path | None = None,
        progress: Progress | None = None,
        repository: str = REPOSITORY,
        base_tag: str = BASE_TAG,
    ) -> None:
        self._client: docker.DockerClient | None = None
        self.force, self.airgapped, self.pip, self.pip_cert = force, airgapped, pip, pip_cert
        self.progress: Progress = progress or log.info
        self.repository, self.base_tag = repository, base_tag

    @property
    def client(self) -> docker.DockerClient:
        """The shared engine client (made on first use, so planning needs no engine)."""
        if self._client is None:
            self._client = docker_client()
        return self._client

    def tag(self, name: str) -> str:
        """The tag of ``name``: one of our images, ``base`` or ``standin``."""
        if name == "base":
            return self.base_tag
        if name == "standin":
            return STANDIN_TAG
        return f"{self.repository}:{name}"

    def plan(self, names: Iterable[str]) -> list[str]:
        """``names`` with what they are built on (when missing) in front, in build order."""
        order: list[str] = []
        for name in names:
            if name not in IMAGE_NAMES and name not in HELPER_NAMES:
                known = ", ".join([*IMAGE_NAMES, *HELPER_NAMES])
                raise ImageError(f"unknown image {name!r}; known: {known}")
            chain = [name]
            if name in HELPER_PARENTS:
                chain.append(HELPER_PARENTS[name])
            while (parent := IMAGE_NAMES.get(chain[-1])) is not None:
                chain.append(parent)
            if name == "standin":
                chain.append("base")
            order += [n for n in reversed(chain) if n not in order]
        return order

    def build(self, names: Iterable[str] = DEFAULT_IMAGES) -> list[BuildReport]:
        """Build the named images (and what they need) that are missing."""
        requested = list(names) or list(DEFAULT_IMAGES)
        reports: list[BuildReport] = []
        for name in self.plan(requested):
            tag = self.tag(name)
            info = image_exists(self.client, tag)
            if info is not None and name == "server" and not server_is_current(_labels(info)):
                self.progress(f"==> {tag} was built from other source: rebuilding it")
                info = None
            if (
                info is not None
                and name in IMAGE_NAMES
                and _labels(info).get(IMAGE_SOURCE_LABEL) != source_digest(name)
            ):
                self.progress(f"==> {tag} was built from other source: rebuilding it")
                info = None
            if info is not None and not (self.force and name in requested):
                reports.append(BuildReport(tag, "present", info["Id"]))
                continue
            started = time.monotonic()
            self.progress(f"==> building {tag}")
            if name == "base":
                image_id = self.make_base()
            elif name == "standin":
                image_id = self.make_standin()
            elif name == "server":
                image_id = build_server_image(self, tag)
            else:
                image_id = self.build_from_dir(name)
            reports.append(BuildReport(tag, "built", image_id, time.monotonic() - started))
            self.progress(f"==> {tag} built in {time.monotonic() - started:.0f} s")
        return reports

    def build_from_dir(self, name: str) -> str:
        """Build ``images/NAME/Dockerfile`` into our tag, wheels from the host."""
        directory = images_dir() / name
        parent = IMAGE_NAMES[name]
        base = self.tag(parent) if parent else self.python_base()
        buildargs = {"BASE_IMAGE": base}
        extra_dirs: dict[str, Path] = {}
        extra_files: dict[str, bytes | Path] = {}
        network_mode = None
        for spec in NPM_PACKAGES.get(name, ()):
            tarball = npm_pack(spec, self.progress)
            extra_files[f"build-extras/{tarball.name}"] = tarball
        if not (directory / "requirements.txt").is_file():
            network_mode = None if name in APT_IMAGES else "none"
        elif self.pip == "host":
            target = probe_python(self.client, base)
            wheels = wheel_cache_dir() / f"{name}-{target.key}"
            requirements = ["-r", str(directory / "requirements.txt")]
            extra_dirs["build-extras/wheels"] = complete_wheels(
                self.client, base, requirements, wheels, target, self.progress
            )
            buildargs["PIP_INSTALL_ARGS"] = "--no-index"
            # proves the image needs nothing from the network (but Debian's archive)
            network_mode = None if name in APT_IMAGES else "none"
        elif self.pip_cert is not None:
            extra_files["build-extras/ca.pem"] = self.pip_cert
        context = build_context(directory, extra_dirs=extra_dirs, extra_files=extra_files)
        return run_build(
            context,
            tag=self.tag(name),
            progress=self.progress,
            buildargs=buildargs,
            labels={IMAGE_SOURCE_LABEL: source_digest(name)},
            network_mode=network_mode,
        )

    def python_base(self) -> str:
        """``python:3.11-slim`` if present or pullable, else (or if airgapped) our base."""
        if self.airgapped:
            return self.ensure_base()
        if image_exists(self.client, STANDIN_TAG) is not None:
            return STANDIN_TAG
        try:
            self.progress(f"pulling {STANDIN_TAG}")
            self.client.images.pull(STANDIN_TAG)
            return STANDIN_TAG
        except docker.errors.APIError as exc:
            self.progress(
                f"cannot pull {STANDIN_TAG} ({exc.explanation or exc}); "
                "making the base with debootstrap instead (registry-less build)"
            )
            return self.ensure_base()

    def ensure_base(self) -> str:
        """The debootstrap base, made if it is missing."""
        if image_exists(self.client, self.base_tag) is None:
            self.progress(f"==> building {self.base_tag}")
            self.make_base()
        return self.base_tag

    def make_base(self) -> str:
        """Debian minbase + Python via debootstrap, imported as ``base_tag``."""
        if os.geteuid() != 0:
            raise ImageError(
                "making the registry-less base runs debootstrap, which needs root: run the "
                "build as root (e.g. `sudo kernel-sandbox images build --airgapped`), or "
                f"provide {STANDIN_TAG} (docker pull or docker load) and build without "
                "--airgapped"
            )
        if shutil.which("debootstrap") is None:
            raise ImageError(
                "making the registry-less base needs debootstrap: "
                "`apt-get install -y debootstrap` (Debian/Ubuntu), then build again"
            )
        mirror = os.environ.get("KERNEL_SANDBOX_DEBIAN_MIRROR")
        with tempfile.TemporaryDirectory(prefix="kernel-sandbox-base-", dir="/var/tmp") as tmp:
            rootfs, archive = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
            argv = ["debootstrap", "--variant=minbase", f"--include={DEBIAN_PACKAGES}"]
            argv += [DEBIAN_SUITE, str(rootfs), *([mirror] if mirror else [])]
            self.progress("$ " + " ".join(argv))
            _run_logged(argv, self.progress)
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for path in (rootfs / junk).glob("*"):
                    if path.is_file():
                        path.unlink()
            _run_logged(["tar", "-C", str(rootfs), "-cf", str(archive), "."], self.progress)
            repository, _, tag = self.base_tag.rpartition(":")
            self.progress(f"importing {archive} as {self.base_tag}")
            build_client().api.import_image(
                src=str(archive),
                repository=repository,
                tag=tag,
                changes=[f"ENV PATH={DEFAULT_PATH}", "ENV LANG=C.UTF-8", 'CMD ["python3"]'],
            )
        info = image_exists(self.client, self.base_tag)
        if info is None:
            raise ImageError(
                f"importing the debootstrap root file system as {self.base_tag} failed"
            )
        return str(info["Id"])

    def make_standin(self) -> str:
        """A plain ``python:3.11-slim`` (no ipykernel) from our base, for tests and CI.

        Debian bookworm's Python is 3.11, so the tag tells the truth about the version.
        """
        base = self.ensure_base()
        dockerfile = (
            f'FROM {base}\nENV PATH={DEFAULT_PATH} LANG=C.UTF-8\nCMD ["python3"]\n'
        ).encode()
        return run_build(
            build_context(extra_files={"Dockerfile": dockerfile}),
            tag=STANDIN_TAG,
            progress=self.progress,
            labels={STANDIN_LABEL: f"made from {base}, not the upstream image"},
            network_mode="none",
        )


def _labels(info: dict[str, Any]) -> dict[str, str]:
    return dict((info.get("Config") or {}).get("Labels") or {})


def _run_logged(argv: list[str], progress: Progress) -> None:
    tail: deque[str] = deque(maxlen=20)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line.rstrip())
        if line.startswith(("I: Retrieving", "I: Base system", "E:", "W:")):
            progress("  " + line.rstrip())
    if proc.wait() != 0:
        log_tail = "\n".join(tail)
        raise ImageError(f"`{' '.join(argv[:2])} ...` failed (exit {proc.returncode}):\n{log_tail}")
