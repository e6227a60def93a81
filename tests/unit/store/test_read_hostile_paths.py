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
