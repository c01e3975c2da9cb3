"""Which images a client may name: whole references, matched part by part.

``--allow-image`` patterns used to be matched with ``fnmatch`` against the name as the
client wrote it, so ``kernel-sandbox*`` also let ``kernel-sandbox.attacker.example/evil``
through (a registry the attacker runs).  Here a reference and a pattern are both split
the way the engine reads them (registry, repository path, tag) and each part is matched
on its own: ``*`` never crosses from the repository into the registry, nor from one
path part into the next.  A pattern without a registry means Docker Hub's (as the
engine reads ``python:3.11-slim``), one without a tag means any tag.  A lone ``*``
allows every reference.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["ImageReference", "image_allowed", "parse_reference"]

#: The registry Docker reads for a reference without one.
DEFAULT_REGISTRY = "docker.io"
#: Characters of a reference (the engine's grammar, plus ``*``/``?`` in patterns).
_REFERENCE = re.compile(r"^[A-Za-z0-9._:/@+*?-]{1,255}$")
#: The engine's grammar of a reference's parts (patterns are checked only for characters).
_PART = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^(?:\w[\w.-]{0,127}|@[a-z0-9]+:[a-f0-9]{32,128})$")
_REGISTRY = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9-]+)*(?::\d{1,5})?$")


@dataclass(frozen=True)
class ImageReference:
    """A reference as the engine reads it: ``registry/path:tag`` (or ``@digest``)."""

    registry: str
    path: tuple[str, ...]
    tag: str


def parse_reference(ref: str, *, pattern: bool = False) -> ImageReference:
    """Split ``ref`` into registry, repository path and tag (``ConfigError`` if malformed).

    A pattern without a tag gets the tag ``*`` (any); a reference without one, ``latest``.
    """
    if not _REFERENCE.fullmatch(ref) or "//" in ref or ref.startswith("/"):
        raise ConfigError(f"image {ref!r} is not an image reference (e.g. 'python:3.11-slim')")
    name, at, digest = ref.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    tag = "*" if pattern else "latest"
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    if at:
        tag = "@" + digest
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first.lower(), rest
    else:
        registry, repository = DEFAULT_REGISTRY, name
    path = tuple(repository.split("/"))
    if registry == DEFAULT_REGISTRY and len(path) == 1:
        path = ("library", *path)
    parts_ok = all(path) and tag != ""
    if not pattern:
        parts_ok = parts_ok and all(_PART.fullmatch(part) for part in path)
        parts_ok = parts_ok and bool(_TAG.fullmatch(tag) and _REGISTRY.fullmatch(registry))
    if not parts_ok:
        raise ConfigError(f"image {ref!r} is not an image reference (e.g. 'python:3.11-slim')")
    return ImageReference(registry, path, tag)


def _matches(ref: ImageReference, pat: ImageReference) -> bool:
    return (
        fnmatch.fnmatchcase(ref.registry, pat.registry)
        and len(ref.path) == len(pat.path)
        and all(fnmatch.fnmatchcase(a, b) for a, b in zip(ref.path, pat.path, strict=True))
        and fnmatch.fnmatchcase(ref.tag, pat.tag)
    )


def image_allowed(image: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``image`` matches one of ``patterns`` as a whole reference.

    A malformed ``image`` raises ``ConfigError``; ``*`` alone allows any well-formed one.
    """
    ref = parse_reference(image)
    return any(p == "*" or _matches(ref, parse_reference(p, pattern=True)) for p in patterns)
