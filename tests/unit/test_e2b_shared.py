"""The E2B records on the shared record directory (:mod:`kernel_sandbox.server.e2b.shared`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.limits import E2B_RECORD_BYTES
from kernel_sandbox.server.e2b.shared import RECORDS_DIR, SHARED_FIELDS, RecordStore

FIELDS = {name: None for name in SHARED_FIELDS} | {
    "id": "abc123",
    "owner": "k1",
    "envs": {"A": "1"},
    "end_at": 5.0,
}


def test_a_record_is_written_whole_private_and_read_back(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    assert store.load("abc123") is None and store.stamp("abc123") is None
    store.save(FIELDS)
    path = tmp_path / RECORDS_DIR / "abc123.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / RECORDS_DIR).stat().st_mode & 0o777 == 0o700
    loaded = store.load("abc123")
    assert loaded is not None and loaded[1] == FIELDS
    first = store.stamp("abc123")
    assert loaded[0] == first
    store.save({**FIELDS, "end_at": 6.0})  # a change is a new file: a new stamp
    assert store.stamp("abc123") != first
    assert store.ids() == ["abc123"]  # no temporary file left beside it
    store.remove("abc123")
    store.remove("abc123")
    assert store.load("abc123") is None and store.ids() == []


def test_ids_that_are_paths_name_no_record(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    for bad in ("../k1/x", "", "a/b", "." * 3, "x" * 65):
        assert store.load(bad) is None and store.stamp(bad) is None
        with pytest.raises(ConfigError):
            store.save({**FIELDS, "id": bad})
    assert not list(tmp_path.rglob("*.json"))


def test_a_record_over_the_cap_is_refused_and_a_file_over_it_ignored(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    with pytest.raises(ConfigError, match="at most"):
        store.save({**FIELDS, "envs": {"BIG": "x" * E2B_RECORD_BYTES}})
    assert store.ids() == []  # nothing kept of it
    store.save(FIELDS)
    path = tmp_path / RECORDS_DIR / "abc123.json"
    body = path.read_bytes()
    path.write_bytes(body[:-1] + b" " * (4 * E2B_RECORD_BYTES) + b"}")  # valid JSON, too big
    assert store.load("abc123") is None
    path.write_bytes(b"{not json")
    assert store.load("abc123") is None
    path.write_bytes(body.replace(b"abc123", b"zzz999"))  # another sandbox's record
    assert store.load("abc123") is None
    store.save({k: v for k, v in FIELDS.items() if k != "end_at"})  # another version's
    assert store.load("abc123") is None
    store.save({**FIELDS, "later": 1})  # a field of a later version is left out
    loaded = store.load("abc123")
    assert loaded is not None and loaded[1] == FIELDS
