"""Any Python image works: resolve an image to a kernel-ready one, deriving it once.

An image is kernel-ready when it carries the label ``kernel-sandbox.kernel-python``
(ours, and every image built ``FROM`` them).  Any other image with CPython >= 3.8 gets
a derived image, built once and cached by the source image's id: a venv at /opt/venv
that still sees the image's own packages, ipykernel from wheels the host downloaded,
the user ``sandbox`` and /sandbox.  The build runs without network.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.utils import parse_repository_tag

from ....config import KERNEL_PYTHON, LABEL_PREFIX
from ....errors import ImageError, ImageNotFoundError
from ....threads import in_thread
from ..engine import docker_client
from .builder import DEFAULT_PATH, REPOSITORY
from .engine_build import image_exists, run_build
from .wheels import Progress, build_context, complete_wheels, probe_python, wheel_cache_dir

__all__ = [
    "DERIVED_FROM",
    "DERIVED_REPOSITORY",
    "KERNEL_LABEL",
    "derive_dockerfile",
    "derive_image",
    "derived_tag",
    "forget_resolved",
    "resolve_kernel_image",
]

log = logging.getLogger("kernel_sandbox.images")

KERNEL_LABEL = f"{LABEL_PREFIX}.kernel-python"
DERIVED_FROM = f"{LABEL_PREFIX}.derived-from"
DERIVED_FROM_NAME = f"{LABEL_PREFIX}.derived-from-name"
DERIVED_REPOSITORY = "kernel-sandbox-derived"
#: What the derived image installs into its venv (pip too: `pip install` in a sandbox;
#: dill for portable snapshots of the kernel's variables).
KERNEL_REQUIREMENTS = ["ipykernel", "dill", "pip"]
SETUP_SCRIPT = Path(__file__).with_name("_setup.py")

_resolved: dict[tuple[str, bool], str] = {}
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


async def resolve_kernel_image(
    image: str,
    *,
    derive: bool,
    progress: Progress | None = None,
    client: docker.DockerClient | None = None,
) -> str:
    """The image to start for ``image``: itself if kernel-ready, else a derived one.

    Called on every sandbox start, so the answer is remembered for the process: after
    the first call for an image, no engine call is made.  ``client`` is the engine to
    ask (default: the process-wide one).  With ``derive=False`` an
    image without the label is returned unchanged (its kernel must be at
    /opt/venv/bin/python).  Raises ImageNotFoundError when the image is neither local
    nor pullable, ImageError when it has no usable Python.
    """
    hit = _resolved.get((image, derive))
    if hit is not None:
        return hit
    return await in_thread(_resolve, image, derive, progress or log.info, client)


def forget_resolved() -> None:
    """Forget remembered resolutions (after images were removed or rebuilt)."""
    _resolved.clear()


def _resolve(
    image: str, derive: bool, progress: Progress, client: docker.DockerClient | None
) -> str:
    with _locks_guard:
        lock = _locks.setdefault(image, threading.Lock())
    with lock:  # concurrent sandboxes on a new image derive it once
        hit = _resolved.get((image, derive))
        if hit is not None:
            return hit
        client = client or docker_client()
        attrs = _inspect_or_pull(client, image, progress)
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if KERNEL_LABEL in labels:
            result = image
        elif derive:
            result = derive_image(image, attrs=attrs, progress=progress, client=client)
        else:
            log.warning("image %s has no %s label; starting it as it is", image, KERNEL_LABEL)
            result = image
        _resolved[(image, derive)] = result
        return result


def _inspect_or_pull(client: docker.DockerClient, image: str, progress: Progress) -> Any:
    attrs = image_exists(client, image)
    if attrs is not None:
        return attrs
    repository, tag = parse_repository_tag(image)
    advice = (
        "build it with `kernel-sandbox images build`"
        if repository == REPOSITORY
        else "pull it (`docker pull`), load it (`docker load`) or build it"
    )
    if repository != REPOSITORY:  # ours are never on a registry
        try:
            progress(f"image {image} is not here; pulling it")
            client.images.pull(repository, tag=tag or "latest")
            if (attrs := image_exists(client, image)) is not None:
                return attrs
        except docker.errors.APIError as exc:
            advice += f" (pulling failed: {exc.explanation or exc})"
    raise ImageNotFoundError(f"image {image!r} is not on this engine: {advice}")


def derived_tag(source_id: str) -> str:
    """The cache tag of the image derived from image id ``source_id``."""
    return f"{DERIVED_REPOSITORY}:{source_id.removeprefix('sha256:')[:12]}"


def derive_dockerfile(source: str, python: str, env: list[str], labels: dict[str, str]) -> str:
    """The Dockerfile deriving a kernel-ready image from ``source``.

    Two stages so the wheels never end up in a layer of the result.  ``python`` is
    the image's interpreter; ``env`` its ``Config.Env`` (PATH and LANG are kept).
    """
    have = dict(item.split("=", 1) for item in env if "=" in item)
    path = f"/opt/venv/bin:{have.get('PATH', DEFAULT_PATH)}"
    lang = "" if "LANG" in have else " LANG=C.UTF-8"
    label_args = " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    return (
        f"FROM {source} AS build\n"
        "USER 0\n"
        "COPY ks/ /tmp/ks/\n"
        f'RUN ["{python}", "/tmp/ks/setup.py", "venv"]\n'
        f"FROM {source}\n"
        "USER 0\n"
        "COPY --from=build /opt/venv /opt/venv\n"
        "COPY ks/setup.py /tmp/ks-setup.py\n"
        f'RUN ["{python}", "/tmp/ks-setup.py", "user"]\n'
        f'ENV PATH="{path}" PYTHONUNBUFFERED=1{lang}\n'
        "ENTRYPOINT []\n"
        f'CMD ["{KERNEL_PYTHON}", "-m", "ipykernel_launcher", "--help"]\n'
        "USER sandbox\n"
        "WORKDIR /sandbox\n"
        f"LABEL {label_args}\n"
    )


def derive_image(
    image: str,
    *,
    attrs: Any = None,
    progress: Progress | None = None,
    client: docker.DockerClient | None = None,
) -> str:
    """Build (once) and return the kernel-ready image derived from ``image``.

    ``client`` is the engine to build on (default: the process-wide one).
    """
    progress = progress or log.info
    client = client or docker_client()
    attrs = attrs or _inspect_or_pull(client, image, progress)
    source_id = str(attrs["Id"])
    tag = derived_tag(source_id)
    existing = image_exists(client, tag)
    if (
        existing
        and ((existing.get("Config") or {}).get("Labels") or {}).get(DERIVED_FROM) == source_id
    ):
        return tag
    note = f"deriving a kernel-ready image from {image} as {tag} (once; about a minute)"
    log.warning(note)  # visible by default: the first sandbox on this image waits for it
    if progress != log.info:  # bound methods compare equal, never identical
        progress(note)
    target = probe_python(client, source_id, name=image)
    problem = target.problem()
    if problem:
        raise ImageError(f"image {image!r} cannot run a kernel: {problem}")
    wheels = complete_wheels(
        client,
        source_id,
        KERNEL_REQUIREMENTS,
        wheel_cache_dir() / f"kernel-{target.key}",
        target,
        progress,
    )
    env = (attrs.get("Config") or {}).get("Env") or []
    labels = {
        KERNEL_LABEL: KERNEL_PYTHON,
        DERIVED_FROM: source_id,
        DERIVED_FROM_NAME: image,
        f"{LABEL_PREFIX}.image": "derived",
    }
    dockerfile = derive_dockerfile(source_id, target.executable, env, labels)
    context = build_context(
        extra_dirs={"ks/wheels": wheels},
        extra_files={"Dockerfile": dockerfile.encode(), "ks/setup.py": SETUP_SCRIPT},
    )
    run_build(context, tag=tag, progress=progress, network_mode="none")
    progress(f"derived {tag} from {image}")
    return tag
