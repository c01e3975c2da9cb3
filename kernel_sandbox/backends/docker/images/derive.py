"""Any Python image works: resolve an image to a kernel-ready one, deriving it once.

An image is kernel-ready when it carries the label ``kernel-sandbox.kernel-python``
(ours, and every image built ``FROM`` them).  Any other image with CPython >= 3.8 gets
a derived image, built once and cached by the source image's id: a venv at /opt/venv
that still sees the image's own packages, ipykernel from wheels the host downloaded,
the user ``sandbox`` and /sandbox.  The build runs without network.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import re
import tarfile
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
from docker.utils import parse_repository_tag

from ....config import KERNEL_PYTHON, LABEL_PREFIX
from ....errors import ImageError, ImageNotFoundError
from ....limits import IMAGE_RESOLVE_WORKERS, IMAGE_VENV_BYTES
from ....threads import after_fork
from ..engine import docker_client
from .accounts import SandboxAccount, read_image_file, sandbox_account
from .builder import DEFAULT_PATH, REPOSITORY
from .confined import Confinement
from .engine_build import image_exists, run_build
from .wheels import (
    Progress,
    PythonTarget,
    build_context,
    complete_wheels,
    probe_python,
    run_with_files,
    wheel_cache_dir,
)

__all__ = [
    "DERIVED_FROM",
    "DERIVED_REPOSITORY",
    "KERNEL_LABEL",
    "derive_dockerfile",
    "derive_image",
    "derived_tag",
    "forget_resolved",
    "is_resolved",
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
VENV = "/opt/venv"
#: The venv's in-memory mount while it is built (owned by the confined user; exec for
#: the compiled modules ipykernel imports).
VENV_MOUNT = f"rw,exec,nosuid,nodev,size={IMAGE_VENV_BYTES},uid=65534,gid=65534,mode=0755"
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./:+-]{1,1024}$")
_pools: list[ThreadPoolExecutor] = []


def _pool() -> ThreadPoolExecutor:
    """Where image resolution (engine calls, probes, derivations) runs: not the shared
    executor, so however many images are being derived, other work goes on (made
    afresh in a forked child, as :mod:`kernel_sandbox.threads` does)."""
    with _locks_guard:
        if not _pools:
            _pools.append(
                ThreadPoolExecutor(IMAGE_RESOLVE_WORKERS, thread_name_prefix="kernel-sandbox-image")
            )
        return _pools[0]


after_fork(_pools.clear)

_resolved: dict[tuple[str, bool], str] = {}
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


async def resolve_kernel_image(
    image: str,
    *,
    derive: bool,
    pull: bool = True,
    progress: Progress | None = None,
    client: docker.DockerClient | None = None,
    limits: Confinement | None = None,
) -> str:
    """The image to start for ``image``: itself if kernel-ready, else a derived one.

    Called on every sandbox start, so the answer is remembered for the process: after
    the first call for an image, no engine call is made.  ``client`` is the engine to
    ask (default: the process-wide one).  With ``derive=False`` an image without the
    label is returned unchanged (its kernel must be at /opt/venv/bin/python), unless
    it was derived before: then that derived image.  With ``pull=False`` an image the
    engine lacks is refused instead of pulled.  ``limits`` are the runtime and limits
    the sandbox will have: what deriving runs of the image runs under them too (never
    past ``IMAGE_STEP_*``).  Raises
    ImageNotFoundError when the image is neither local nor pullable, ImageError when it
    has no usable Python.
    """
    hit = _resolved.get((image, derive))
    if hit is not None:
        return hit
    call = functools.partial(_resolve, image, derive, pull, progress or log.info, client, limits)
    return await asyncio.get_running_loop().run_in_executor(_pool(), call)


def is_resolved(image: str, derive: bool) -> bool:
    """Whether :func:`resolve_kernel_image` answers ``image`` at once (no engine call)."""
    return (image, derive) in _resolved


def forget_resolved() -> None:
    """Forget remembered resolutions (after images were removed or rebuilt)."""
    _resolved.clear()


def _resolve(
    image: str,
    derive: bool,
    pull: bool,
    progress: Progress,
    client: docker.DockerClient | None,
    limits: Confinement | None = None,
) -> str:
    with _locks_guard:
        lock = _locks.setdefault(image, threading.Lock())
    with lock:  # concurrent sandboxes on a new image derive it once
        hit = _resolved.get((image, derive))
        if hit is not None:
            return hit
        client = client or docker_client()
        attrs = _inspect_or_pull(client, image, progress, pull)
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if KERNEL_LABEL in labels:
            result = image
        elif (done := _derived_already(client, str(attrs["Id"]))) is not None:
            result = done  # derived before (by the operator, or with derive on)
        elif derive:
            result = derive_image(
                image, attrs=attrs, progress=progress, client=client, limits=limits
            )
        else:
            log.warning("image %s has no %s label; starting it as it is", image, KERNEL_LABEL)
            result = image
        _resolved[(image, derive)] = result
        return result


def _inspect_or_pull(
    client: docker.DockerClient, image: str, progress: Progress, pull: bool = True
) -> Any:
    attrs = image_exists(client, image)
    if attrs is not None:
        return attrs
    repository, tag = parse_repository_tag(image)
    advice = (
        "build it with `kernel-sandbox images build`"
        if repository == REPOSITORY
        else "pull it (`docker pull`), load it (`docker load`) or build it"
    )
    if not pull:
        advice = (
            f"this engine does not pull images (a server's --pull never); ask its operator "
            f"to {advice.replace(' it', ' it there', 1)}"
        )
    elif repository != REPOSITORY:  # ours are never on a registry
        try:
            progress(f"image {image} is not here; pulling it")
            client.images.pull(repository, tag=tag or "latest")
            if (attrs := image_exists(client, image)) is not None:
                return attrs
        except docker.errors.APIError as exc:
            advice += f" (pulling failed: {exc.explanation or exc})"
    raise ImageNotFoundError(f"image {image!r} is not on this engine: {advice}")


def _derived_already(client: docker.DockerClient, source_id: str) -> str | None:
    tag = derived_tag(source_id)
    existing = image_exists(client, tag)
    labels = ((existing or {}).get("Config") or {}).get("Labels") or {}
    return tag if labels.get(DERIVED_FROM) == source_id else None


def derived_tag(source_id: str) -> str:
    """The cache tag of the image derived from image id ``source_id``."""
    return f"{DERIVED_REPOSITORY}:{source_id.removeprefix('sha256:')[:12]}"


def derive_dockerfile(
    source_id: str, account: SandboxAccount, env: list[str], labels: dict[str, str]
) -> str:
    """The Dockerfile deriving a kernel-ready image from image id ``source_id``.

    It only copies files in (the venv built confined, the account files, the user's
    directories) and sets metadata: no ``RUN``, so nothing of the image runs while it
    builds.  ``env`` is the image's ``Config.Env``: its PATH is kept when it is a plain
    list of directories, LANG when set.  Every value that came from the image is
    checked or quoted before it is written here.
    """
    if not _IMAGE_ID.fullmatch(source_id):
        raise ImageError(f"{source_id!r} is not an image id")
    have = dict(item.split("=", 1) for item in env if isinstance(item, str) and "=" in item)
    image_path = have.get("PATH", DEFAULT_PATH)
    path = f"/opt/venv/bin:{image_path if _SAFE_PATH.fullmatch(image_path) else DEFAULT_PATH}"
    lang = "" if "LANG" in have else " LANG=C.UTF-8"
    label_args = " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    owner = f"{account.uid}:{account.gid}"
    return (
        f"FROM {source_id}\n"
        "COPY ks/passwd /etc/passwd\n"
        "COPY ks/group /etc/group\n"
        "ADD ks/venv.tar /\n"
        f"COPY --chown={owner} ks/empty/ {account.home}/\n"
        f"COPY --chown={owner} ks/empty/ /sandbox/\n"
        f'ENV PATH="{path}" PYTHONUNBUFFERED=1{lang}\n'
        "ENTRYPOINT []\n"
        f'CMD ["{KERNEL_PYTHON}", "-m", "ipykernel_launcher", "--help"]\n'
        "USER sandbox\n"
        "WORKDIR /sandbox\n"
        f"LABEL {label_args}\n"
    )


def _check_buildable(image: str, attrs: Any) -> None:
    """Refuse images whose ``FROM`` would run their own build steps (ONBUILD)."""
    triggers = (attrs.get("Config") or {}).get("OnBuild") or []
    if triggers:
        raise ImageError(
            f"image {image!r} carries ONBUILD triggers ({len(triggers)}), which would run "
            "in any build FROM it; kernel-sandbox never derives such an image. Build a "
            "kernel-ready image FROM it yourself (see README 'Custom images')."
        )


def build_venv(
    client: docker.DockerClient,
    source_id: str,
    target: PythonTarget,
    wheels: Path,
    limits: Confinement | None = None,
) -> IO[bytes]:
    """The venv with ipykernel, built confined in the image; a tar of opt/venv (spooled).

    The tar is the image's output, so it is copied member by member: only directories,
    regular files and symbolic links under opt/venv, owned by root, without setuid bits.
    """
    files = build_context(
        extra_dirs={"ks/wheels": wheels}, extra_files={"ks/setup.py": SETUP_SCRIPT}
    )
    raw: IO[bytes] = tempfile.TemporaryFile(prefix="kernel-sandbox-venv-")  # noqa: SIM115
    try:
        step = run_with_files(
            client,
            source_id,
            target.executable,
            ["/tmp/ks/setup.py", "venv"],
            files,
            stdout_to=raw,
            stdout_cap=IMAGE_VENV_BYTES,
            tmpfs={VENV: VENV_MOUNT},
            limits=limits,
        )
        if step.code != 0 or step.stopped:
            why = step.stopped or f"exit status {step.code}"
            raise ImageError(f"building the kernel's venv failed ({why}):\n{step.output[-2000:]}")
        raw.seek(0)
        return _clean_venv_tar(raw)
    finally:
        raw.close()


def _clean_venv_tar(raw: IO[bytes]) -> IO[bytes]:
    clean: IO[bytes] = tempfile.TemporaryFile(prefix="kernel-sandbox-venv-")  # noqa: SIM115
    try:
        with (
            tarfile.open(fileobj=raw, mode="r|") as src,
            tarfile.open(fileobj=clean, mode="w") as out,
        ):
            for member in src:
                name = member.name
                inside = name == "opt/venv" or name.startswith("opt/venv/")
                if (
                    not inside
                    or ".." in name.split("/")
                    or not (member.isdir() or member.isfile() or member.issym())
                ):
                    raise ImageError(f"the venv built in the image holds {name!r}: refused")
                member.uid = member.gid = 0
                member.uname = member.gname = "root"
                member.mode &= 0o777
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
    except (tarfile.TarError, EOFError) as exc:
        clean.close()
        raise ImageError(f"the venv built in the image is not a tar archive: {exc}") from None
    except BaseException:
        clean.close()
        raise
    clean.seek(0)
    return clean


def derive_image(
    image: str,
    *,
    attrs: Any = None,
    progress: Progress | None = None,
    client: docker.DockerClient | None = None,
    limits: Confinement | None = None,
) -> str:
    """Build (once) and return the kernel-ready image derived from ``image``.

    ``client`` is the engine to build on (default: the process-wide one).  The image's
    code runs only confined (:mod:`.confined`, under ``limits``): the probe, pip's check
    and the venv build; the
    image build itself copies files in and runs nothing.
    """
    progress = progress or log.info
    client = client or docker_client()
    attrs = attrs or _inspect_or_pull(client, image, progress)
    _check_buildable(image, attrs)
    source_id = str(attrs["Id"])
    tag = derived_tag(source_id)
    if _derived_already(client, source_id) is not None:
        return tag
    note = f"deriving a kernel-ready image from {image} as {tag} (once; about a minute)"
    log.warning(note)  # visible by default: the first sandbox on this image waits for it
    if progress != log.info:  # bound methods compare equal, never identical
        progress(note)
    target = probe_python(client, source_id, name=image, limits=limits)
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
        limits,
    )
    account = sandbox_account(
        read_image_file(client, source_id, "/etc/passwd"),
        read_image_file(client, source_id, "/etc/group"),
    )
    env = (attrs.get("Config") or {}).get("Env") or []
    labels = {
        KERNEL_LABEL: KERNEL_PYTHON,
        DERIVED_FROM: source_id,
        DERIVED_FROM_NAME: image,
        f"{LABEL_PREFIX}.image": "derived",
    }
    dockerfile = derive_dockerfile(source_id, account, env, labels)
    progress(f"building the kernel's venv in {image} (confined: no network, uid 65534)")
    with build_venv(client, source_id, target, wheels, limits) as venv:
        context = _derive_context(dockerfile, account, venv)
    run_build(context, tag=tag, progress=progress, network_mode="none")
    progress(f"derived {tag} from {image}")
    return tag


def _derive_context(dockerfile: str, account: SandboxAccount, venv: IO[bytes]) -> IO[bytes]:
    spool: IO[bytes] = tempfile.TemporaryFile(prefix="kernel-sandbox-context-")  # noqa: SIM115
    with tarfile.open(fileobj=spool, mode="w") as tar:
        for name, data in (
            ("Dockerfile", dockerfile.encode()),
            ("ks/passwd", account.passwd),
            ("ks/group", account.group),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        empty = tarfile.TarInfo("ks/empty")
        empty.type, empty.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(empty)
        venv.seek(0, io.SEEK_END)
        info = tarfile.TarInfo("ks/venv.tar")
        info.size, info.mode = venv.tell(), 0o644
        venv.seek(0)
        tar.addfile(info, venv)
    spool.seek(0)
    return spool
