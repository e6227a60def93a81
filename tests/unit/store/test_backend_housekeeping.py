"""What gc needs of a store backend beyond names: sizes, leftovers of writes, empty prefixes, a prefix's own marker."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.store.backend import (
    ObjectInfo,
    PosixBackend,
    S3Backend,
    UnsafeStoreNameError,
)


class ListingOnlyClient:
    """A boto3 S3 client double that answers ListObjectsV2 and fails every other request."""

    def __init__(self, keys: dict[str, int]) -> None:
        self.keys = keys
        self.listed: list[dict[str, Any]] = []

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_objects_v2"
        client = self

        class Paginator:
            def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
                client.listed.append(kwargs)
                at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                return [{"Contents": [{"Key": k, "Size": size, "LastModified": at, "ETag": '"e"'}
                                      for k, size in sorted(client.keys.items()) if k.startswith(kwargs["Prefix"])]}]

        return Paginator()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"S3 request {name} made: sizes must come from the listing")


def test_s3_sizes_and_times_come_from_one_listing_without_a_request_per_object() -> None:
    client = ListingOnlyClient({"base/etl/r/s/subtask=0/attempt=0/data/a.parquet": 10,
                                "base/etl/r/s/subtask=0/attempt=0/data/_sp=1/b.parquet": 5,
                                "base/etl/r/s/subtask=0/attempt=0/_SUCCESS": 2})
    store = S3Backend("s3://bucket/base", client=client)  # type: ignore[arg-type]
    infos = store.stat_all("etl/r/s/subtask=0/attempt=0/data")
    assert [(i.name, i.size, i.links, i.identity) for i in infos] == [
        ("etl/r/s/subtask=0/attempt=0/data/_sp=1/b.parquet", 5, 1, ""),
        ("etl/r/s/subtask=0/attempt=0/data/a.parquet", 10, 1, "")]
    assert {i.mtime for i in infos} == {datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()}
    assert [call["Prefix"] for call in client.listed] == ["base/etl/r/s/subtask=0/attempt=0/data/"]
    # Writes need no temporary object and a prefix has no existence of its own: nothing to find or prune.
    assert store.temporaries("etl") == [] and store.prune_empty("etl") is False


def test_posix_stat_tells_hard_links_apart_by_inode(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    store.replace("a/one", b"x" * 7)
    (tmp_path / "a" / "two").hardlink_to(tmp_path / "a" / "one")
    one, two = store.stat("a/one"), store.stat("a/two")
    assert one is not None and two is not None
    assert (one.size, one.links) == (7, 2) and one.identity == two.identity != ""
    assert [i.name for i in store.stat_all("a")] == ["a/one", "a/two"]
    assert store.stat_all("missing") == []


def test_posix_prune_empty_removes_only_an_empty_directory_and_never_the_root(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    (tmp_path / "empty").mkdir()
    store.replace("full/x.json", b"{}")
    assert store.prune_empty("empty") and not (tmp_path / "empty").exists()
    assert not store.prune_empty("full") and (tmp_path / "full" / "x.json").is_file()
    assert not store.prune_empty("missing")
    with pytest.raises(UnsafeStoreNameError):
        store.prune_empty("")
    with pytest.raises(UnsafeStoreNameError):
        store.prune_empty("../x")


def test_posix_temporaries_are_the_leftovers_of_interrupted_writes_only(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    store.replace("s/plan.json", b"{}")
    for name in ("s/.plan.json.ab12.tmp", "s/sub/.status.json.cd34.tmp", "s/data/.part.ef56.tmp", "s/notes.tmp"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{")
    assert [i.name for i in store.temporaries("s")] == [
        "s/.plan.json.ab12.tmp", "s/data/.part.ef56.tmp", "s/sub/.status.json.cd34.tmp"]
    assert [i.name for i in store.temporaries("s", skip=("data",))] == [
        "s/.plan.json.ab12.tmp", "s/sub/.status.json.cd34.tmp"]
    assert [i.name for i in store.temporaries("s", recursive=False)] == ["s/.plan.json.ab12.tmp"]
    assert all(isinstance(i, ObjectInfo) and i.size == 1 for i in store.temporaries("s"))
    assert "s/.plan.json.ab12.tmp" not in store.list_names("s")  # listings never show them


def test_claimed_asks_for_the_prefixs_own_marker_where_owns_walks_up(tmp_path: Path) -> None:
    store = PosixBackend(tmp_path)
    store.claim("")
    assert store.claimed("") and store.owns("etl/r1") and not store.claimed("etl/r1")
    store.claim("etl/r1")
    assert store.claimed("etl/r1")
    PosixBackend(tmp_path, owner="another store").claim("etl/r2")
    assert not store.claimed("etl/r2") and not store.owns("etl/r2")
