"""Running a build on the engine: where the Dockerfiles are, and one streamed build.

Shared by the image builder, the derived images and the server image; it imports
none of them (no import cycle between the builder and the server image).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors

from ....errors import ImageError
from ....results import strip_ansi
from ..engine import docker_client
from .wheels import Progress

__all__ = ["build_client", "image_exists", "images_dir", "run_build"]


def images_dir() -> Path:
    """The ``images/`` directory with the Dockerfiles (``$KERNEL_SANDBOX_IMAGES``)."""
    path = Path(os.environ.get("KERNEL_SANDBOX_IMAGES") or Path(__file__).parents[4] / "images")
    if not (path / "python" / "Dockerfile").is_file():
        raise ImageError(
            f"no Dockerfiles under {path}: run from a clone of kernel-sandbox "
            "(pip install -e .) or set KERNEL_SANDBOX_IMAGES to its images/ directory"
        )
    return path


def image_exists(client: docker.DockerClient, ref: str) -> dict[str, Any] | None:
    """The engine's inspect data for ``ref``, or None when it is not present locally."""
    try:
        return client.api.inspect_image(ref)  # type: ignore[no-any-return]
    except docker.errors.ImageNotFound:
        return None


def build_client() -> docker.DockerClient:
    """A client without a read timeout: a quiet build step may take minutes."""
    docker_client()  # raises EngineUnavailableError with advice when there is no engine
    return docker.from_env(timeout=3600)


def run_build(
    context: IO[bytes],
    *,
    tag: str,
    progress: Progress,
    buildargs: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    network_mode: str | None = None,
) -> str:
    """Build a tar ``context`` into ``tag``, streaming the log; return the image id."""
    tail: deque[str] = deque(maxlen=25)
    client = build_client()
    try:
        stream = client.api.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            buildargs=dict(buildargs or {}),
            labels=dict(labels or {}),
            network_mode=network_mode,
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in stream:
            if "stream" in chunk:
                for line in strip_ansi(str(chunk["stream"])).splitlines():  # coloured stderr
                    if line.strip():
                        tail.append(line)
                        progress(line)
            elif "error" in chunk:
                log_tail = "\n".join(tail)
                raise ImageError(f"building {tag} failed: {chunk['error'].strip()}\n{log_tail}")
    except docker.errors.APIError as exc:
        raise ImageError(f"the engine refused to build {tag}: {exc.explanation or exc}") from exc
    finally:
        context.close()
        client.close()
    info = image_exists(docker_client(), tag)
    if info is None:
        raise ImageError(f"the build of {tag} ended without an image; log:\n" + "\n".join(tail))
    return str(info["Id"])
