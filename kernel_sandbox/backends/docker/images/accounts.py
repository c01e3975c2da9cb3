"""The ``sandbox`` user of a derived image, added to the image's account files as data.

A derived image needs a non-root user ``sandbox`` (uid 1000 when free, like
kernel-sandbox:python).  Instead of running the image's code as root to add it, the
host reads /etc/passwd and /etc/group out of the image (from a container that is
created, never started), parses them as text with a size cap, and the build copies
the amended files in.  Nothing the image carries runs for this.
"""

from __future__ import annotations

import contextlib
import io
import re
import tarfile
from dataclasses import dataclass

import docker
import docker.errors

from ....errors import ImageError
from ....limits import IMAGE_ACCOUNT_FILE_BYTES
from .confined import PROBE_LABEL

__all__ = ["SandboxAccount", "read_image_file", "sandbox_account"]

USER = "sandbox"
_HOME = re.compile(r"^/[A-Za-z0-9._/-]{0,200}$")


@dataclass(frozen=True)
class SandboxAccount:
    """The user ``sandbox`` in a derived image, and the account files that hold it."""

    uid: int
    gid: int
    home: str
    passwd: bytes
    group: bytes


def read_image_file(client: docker.DockerClient, image: str, path: str) -> bytes | None:
    """A regular file of ``image`` (at most ``IMAGE_ACCOUNT_FILE_BYTES``), or None.

    The container is created to reach the file and removed; it never starts.
    """
    api = client.api
    container = api.create_container(
        image, entrypoint=["/nonexistent"], labels={PROBE_LABEL: "1"}, network_disabled=True
    )["Id"]
    try:
        try:
            stream, _stat = api.get_archive(container, path)
        except docker.errors.NotFound:
            return None
        too_large = ImageError(
            f"{path} of image {image!r} is larger than kernel-sandbox reads"
            f" ({IMAGE_ACCOUNT_FILE_BYTES} bytes)"
        )
        buffer = io.BytesIO()
        for chunk in stream:
            buffer.write(chunk)
            if buffer.tell() > IMAGE_ACCOUNT_FILE_BYTES + 64 * 1024:
                raise too_large
        buffer.seek(0)
        with tarfile.open(fileobj=buffer) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            if member is not None and member.size > IMAGE_ACCOUNT_FILE_BYTES:
                raise too_large  # refused whole: a cut file would end mid-line
            blob = tar.extractfile(member) if member is not None else None
            return blob.read() if blob is not None else None
    except tarfile.TarError:
        return None
    finally:
        with contextlib.suppress(docker.errors.APIError):
            api.remove_container(container, force=True)


def _rows(text: bytes) -> list[list[str]]:
    lines = text.decode(errors="replace").splitlines()
    return [line.split(":") for line in lines if line and not line.startswith("#")]


def _number(value: str) -> int | None:
    return int(value) if value.isdigit() and len(value) < 10 else None


def _free_id(used: set[int], start: int = 1000) -> int:
    while start in used:
        start += 1
    return start


def _with_line(text: bytes, line: str) -> bytes:
    return text + (b"" if not text or text.endswith(b"\n") else b"\n") + line.encode() + b"\n"


def sandbox_account(passwd: bytes | None, group: bytes | None) -> SandboxAccount:
    """The ``sandbox`` user given an image's /etc/passwd and /etc/group (None: absent).

    An existing ``sandbox`` entry is kept (its ids and home); otherwise the user gets
    the first free uid from 1000, a group of its own, home /home/sandbox.
    """
    passwd = passwd or b"root:x:0:0:root:/root:/bin/sh\n"
    group = group or b"root:x:0:\n"
    users, groups = _rows(passwd), _rows(group)
    for row in users:
        uid, gid = (_number(row[2]), _number(row[3])) if len(row) >= 7 else (None, None)
        if row[0] == USER and uid is not None and gid is not None:
            home = row[5] if _HOME.fullmatch(row[5]) and ".." not in row[5].split("/") else ""
            return SandboxAccount(uid, gid, home or f"/home/{USER}", passwd, group)
    uid = _free_id({n for row in users if len(row) > 2 and (n := _number(row[2])) is not None})
    gids = {row[0]: _number(row[2]) for row in groups if len(row) > 2}
    known = gids.get(USER)
    if known is not None:
        gid = known
    else:
        used = {n for n in gids.values() if n is not None}
        gid = uid if uid not in used else _free_id(used)
        group = _with_line(group, f"{USER}:x:{gid}:")
    home = f"/home/{USER}"
    passwd = _with_line(passwd, f"{USER}:x:{uid}:{gid}::{home}:/bin/sh")
    return SandboxAccount(uid, gid, home, passwd, group)
