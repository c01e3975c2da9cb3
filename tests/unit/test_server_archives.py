"""Tar uploads are checked by what they unpack to, before anything is decompressed far."""

from __future__ import annotations

import gzip
import io
import resource
import tarfile
import time

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.limits import ARCHIVE_MAX_MEMBERS, ARCHIVE_MEMBER_COST_BYTES
from kernel_sandbox.server.archives import check_archive

MiB = 1024**2
CAP = 100 * MiB  # the server's default max_upload_bytes


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, produced as they are read (the bomb is never held whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        n = min(len(buffer), self.left)
        buffer[:n] = b"\0" * n
        self.left -= n
        return n


def _bomb(size: int) -> bytes:
    out = io.BytesIO()
    gz = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9)
    with gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        info = tarfile.TarInfo("big.bin")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Zeros(size)))
    return out.getvalue()


def _tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_gzip_bomb_stops_at_its_first_header_cheaply() -> None:
    bomb = _bomb(200 * MiB)
    assert len(bomb) < MiB / 4  # the 0.19 MiB body
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.process_time()
    with pytest.raises(ConfigError, match="unpacks to more than"):
        check_archive(bomb, "/sandbox", CAP)
    spent = time.process_time() - started
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024
    print(f"bomb refused after {spent:.3f} s CPU, peak RSS +{grew / MiB:.1f} MiB")
    assert grew < 16 * MiB


def test_many_empty_members_count_toward_the_cap_and_the_member_limit() -> None:
    many = _tar({f"f{i}": b"" for i in range(ARCHIVE_MAX_MEMBERS + 1)})
    with pytest.raises(ConfigError, match="more than 1000 members"):
        check_archive(many, "/sandbox", CAP)
    some = _tar({f"f{i}": b"" for i in range(20)})
    with pytest.raises(ConfigError, match="unpacks to more than"):
        check_archive(some, "/sandbox", 10 * ARCHIVE_MEMBER_COST_BYTES)
    assert check_archive(some, "/sandbox", CAP) == 20


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x"])
def test_members_outside_the_target_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="points outside"):
        check_archive(_tar({name: b"x"}), "/sandbox/dir", CAP)


def test_links_and_garbage_are_refused() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        link = tarfile.TarInfo("l")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(ConfigError, match="not a file or directory"):
        check_archive(out.getvalue(), "/sandbox", CAP)
    with pytest.raises(ConfigError, match="not a tar archive"):
        check_archive(b"\x1f\x8b garbage", "/sandbox", CAP)
