"""Reading store files at hostile paths: missing means missing, anything else is one StoreError naming the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.files import read_json, read_jsonl


def test_a_file_where_a_directory_should_be_reads_as_missing(tmp_path: Path):
    (tmp_path / "plan.json").write_text("{}")
    assert read_json(tmp_path / "plan.json" / "committed.json") is None
    assert read_jsonl(tmp_path / "plan.json" / "journal.jsonl") == []


@pytest.mark.parametrize("make", [
    lambda t: t / ("x" * 300),  # ENAMETOOLONG
    lambda t: Path(str(t) + "/a\0b"),  # a NUL byte
    lambda t: (t / "dir").mkdir() or t / "dir",  # a directory
    lambda t: (t / "bin").write_bytes(b"\xff\xfe\x00") and t / "bin",  # not text
])
def test_anything_else_is_a_store_error_naming_the_path(tmp_path: Path, make):
    path = make(tmp_path)
    with pytest.raises(StoreError, match=r"(cannot read|corrupt JSON in) .*" + tmp_path.name):
        read_json(path)
    if path.name != "bin":
        with pytest.raises(StoreError, match=tmp_path.name):
            read_jsonl(path)


def test_a_record_replaced_by_a_symlink_is_refused_not_followed(tmp_path: Path):
    # An attempt's code can swap its status.json for a link to a file of the reader's host.
    secret = tmp_path / "secret.json"
    secret.write_text('{"error": "the api-server secret"}')
    attempt = tmp_path / "store" / "attempt=0"
    attempt.mkdir(parents=True)
    (attempt / "status.json").symlink_to(secret)
    (attempt / "journal.jsonl").symlink_to(secret)
    with pytest.raises(StoreError, match="symbolic link") as caught:
        read_json(attempt / "status.json")
    assert "api-server secret" not in str(caught.value)
    with pytest.raises(StoreError, match="symbolic link"):
        read_jsonl(attempt / "journal.jsonl")


def test_the_posix_backend_follows_no_linked_directory(tmp_path: Path):
    from airflow_provider_speculative.exceptions import UnsafeStorePathError
    from airflow_provider_speculative.store.backend import PosixBackend

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "speed.json").write_text('{"secret": 1}')
    root = tmp_path / "store"
    root.mkdir()
    (root / "speeds").symlink_to(elsewhere, target_is_directory=True)
    (root / "own").mkdir()
    (root / "own" / "speed.json").write_text('{"mine": 1}')
    backend = PosixBackend(root)
    assert backend.read_json("own/speed.json") == {"mine": 1}
    assert backend.read_json("own/missing.json", {}) == {}
    with pytest.raises(UnsafeStorePathError):
        backend.read_json("speeds/speed.json")
