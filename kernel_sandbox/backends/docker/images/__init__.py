"""Sandbox images: build ours, list what is there, make any Python image kernel-ready.

- :func:`build_images` builds ``kernel-sandbox:python`` and ``kernel-sandbox:datascience``
  from ``images/`` (only what is missing unless ``force``), registry-less when needed.
- :func:`list_images` shows our images, derived and custom ones, and what is missing.
- :func:`resolve_kernel_image` is called on every sandbox start: it returns a
  kernel-ready image for any image with CPython >= 3.8, deriving one once if needed.
- :func:`make_standin_image` makes a plain ``python:3.11-slim`` (no ipykernel) without
  a registry, for tests and CI.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ....config import LABEL_PREFIX
from ..engine import docker_client
from .builder import (
    BASE_TAG,
    IMAGE_NAMES,
    REPOSITORY,
    STANDIN_LABEL,
    STANDIN_TAG,
    BuildReport,
    ImageBuilder,
    PipMode,
)
from .confined import Confinement
from .derive import (
    DERIVED_FROM,
    DERIVED_FROM_NAME,
    KERNEL_LABEL,
    derived_tag,
    forget_resolved,
    resolve_kernel_image,
)
from .wheels import Progress

__all__ = [
    "BASE_TAG",
    "STANDIN_TAG",
    "BuildReport",
    "Confinement",
    "ImageInfo",
    "ImageList",
    "build_images",
    "derived_tag",
    "forget_resolved",
    "list_images",
    "make_standin_image",
    "resolve_kernel_image",
]


async def build_images(
    names: Iterable[str] = (),
    *,
    force: bool = False,
    airgapped: bool = False,
    pip: PipMode = "host",
    pip_cert: Path | None = None,
    progress: Progress | None = None,
    quiet: bool = False,
) -> list[BuildReport]:
    """Build the named images (default: python and datascience) that are missing.

    ``names`` may also hold ``base`` (the debootstrap base) and ``standin``.
    ``airgapped`` makes the base with debootstrap instead of pulling python:3.11-slim
    (this also happens by itself when that image can be neither found nor pulled).
    ``pip="host"`` installs wheels the host's pip downloaded, with no network in the
    build; ``pip="build"`` runs pip inside the build, trusting ``pip_cert`` (a CA bundle
    for TLS-intercepting proxies).  ``progress`` gets each log line (default: the
    ``kernel_sandbox.images`` logger); ``quiet`` drops them.
    """
    report_to = (lambda _line: None) if quiet else progress

    def _build() -> list[BuildReport]:
        builder = ImageBuilder(
            force=force, airgapped=airgapped, pip=pip, pip_cert=pip_cert, progress=report_to
        )
        return builder.build(list(names))

    return await asyncio.to_thread(_build)


async def make_standin_image(*, force: bool = False, progress: Progress | None = None) -> str:
    """Make ``python:3.11-slim`` from the debootstrap base (a plain Python, no kernel).

    Without a registry, this stands in for the upstream image in tests, CI and the
    README's examples.  Returns the image id.
    """
    reports = await build_images(["standin"], force=force, progress=progress)
    return reports[-1].image_id


@dataclass(frozen=True)
class ImageInfo:
    """One tagged image that kernel-sandbox knows about."""

    tag: str
    id: str
    size: int
    created: dt.datetime
    kind: str  # sandbox | server | derived | custom | base | stand-in | python base
    derived_from: str | None = None


@dataclass(frozen=True)
class ImageList:
    """What is present, and which of our images are missing."""

    images: list[ImageInfo] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _kind(tag: str, labels: dict[str, str]) -> str:
    if labels.get(f"{LABEL_PREFIX}.image") == "server":
        return "server"  # kernel-sandbox serve for a cluster (a kernel image underneath)
    if tag.partition(":")[0] == REPOSITORY:
        return "sandbox"
    if DERIVED_FROM in labels:
        return "derived"
    if KERNEL_LABEL in labels:
        return "custom"
    if tag == BASE_TAG:
        return "base"
    return "stand-in" if STANDIN_LABEL in labels else "python base"


async def list_images() -> ImageList:
    """Our images, derived and custom kernel-ready ones, the base, and what is missing."""

    def _list() -> ImageList:
        api = docker_client().api
        rows = api.images(filters={"label": KERNEL_LABEL})
        for ref in (BASE_TAG, STANDIN_TAG):
            rows += api.images(name=ref)
        seen: set[str] = set()
        found: list[ImageInfo] = []
        for row in rows:
            labels = row.get("Labels") or {}
            for tag in row.get("RepoTags") or []:
                if tag in seen or tag == "<none>:<none>":
                    continue
                seen.add(tag)
                found.append(
                    ImageInfo(
                        tag=tag,
                        id=row["Id"].removeprefix("sha256:")[:12],
                        size=int(row.get("Size") or 0),
                        created=dt.datetime.fromtimestamp(int(row["Created"]), dt.UTC),
                        kind=_kind(tag, labels),
                        derived_from=labels.get(DERIVED_FROM_NAME),
                    )
                )
        order = ["sandbox", "server", "custom", "derived", "stand-in", "python base", "base"]
        found.sort(key=lambda i: (order.index(i.kind), i.tag))
        ours = [f"{REPOSITORY}:{name}" for name in IMAGE_NAMES]
        return ImageList(found, [tag for tag in ours if tag not in seen])

    return await asyncio.to_thread(_list)
