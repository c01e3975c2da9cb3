"""The flat archive an exact snapshot is moved in: written as tar, read back only as
plain regular files in one new directory, whatever a changed blob says."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from kernel_sandbox import SnapshotError
from kernel_sandbox.snapshots.flattar import FlatExtractor, flat_tar


def _feed(data: bytes, target: Path, step: int = 333, max_entries: int = 16) -> FlatExtractor:
    target.mkdir()
    extractor = FlatExtractor(target, max_entries)
    for i in range(0, len(data), step):
        extractor.feed(data[i : i + step])
    extractor.finish()
    return extractor


def _tar(members: list[tarfile.TarInfo], body: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(body) if member.isreg() else None)
    return out.getvalue()


def test_files_round_trip_and_tar_reads_them(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.img").write_bytes(os.urandom(70_000))
    (tmp_path / "empty").write_bytes(b"")
    files = [("checkpoint.img", tmp_path / "checkpoint.img"), ("empty", tmp_path / "empty")]
    data = b"".join(flat_tar(files))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert archive.getnames() == ["checkpoint.img", "empty"]
    extractor = _feed(data, tmp_path / "out")
    assert extractor.names == ["checkpoint.img", "empty"]
    assert (tmp_path / "out" / "checkpoint.img").read_bytes() == files[0][1].read_bytes()


def test_a_link_is_not_archived(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("host")
    (tmp_path / "img").symlink_to(tmp_path / "secret")
    with pytest.raises(OSError):
        b"".join(flat_tar([("img", tmp_path / "img")]))


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        (tarfile.REGTYPE, "../escape"),
        (tarfile.REGTYPE, "dir/file"),
        (tarfile.SYMTYPE, "link"),
        (tarfile.DIRTYPE, "folder"),
        (tarfile.FIFOTYPE, "fifo"),
    ],
)
def test_anything_but_a_plain_file_is_refused(tmp_path: Path, kind: bytes, name: str) -> None:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
    member.size = 4 if kind == tarfile.REGTYPE else 0
    with pytest.raises(SnapshotError, match="not expected"):
        _feed(_tar([member], b"evil"), tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_a_name_twice_too_many_files_and_a_cut_stream_are_refused(tmp_path: Path) -> None:
    one = tarfile.TarInfo("a")
    one.size = 4
    with pytest.raises(SnapshotError, match="not expected"):
        _feed(_tar([one, one], b"data"), tmp_path / "twice")
    many = []
    for i in range(3):
        member = tarfile.TarInfo(f"f{i}")
        member.size = 4
        many.append(member)
    with pytest.raises(SnapshotError, match="more than 2 files"):
        _feed(_tar(many, b"data"), tmp_path / "many", max_entries=2)
    whole = _tar([one], b"data")
    with pytest.raises(SnapshotError, match="ended early"):
        _feed(whole[:600], tmp_path / "cut")
    with pytest.raises(SnapshotError, match="data after its end"):
        _feed(whole + b"x" * 10, tmp_path / "trailing")
