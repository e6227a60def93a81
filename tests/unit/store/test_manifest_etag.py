"""Manifests by the store's own content token (S3's ETag): built and verified from listings, no byte read back."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import moto
import pytest

from airflow_provider_speculative.exceptions import PartitionError, StoreError
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend
from airflow_provider_speculative.store.files import json_document
from airflow_provider_speculative.store.manifest import build_manifest, build_manifest_in, verify_files_in
from tests.unit.store.memory import MemoryBackend

DATA = "dag/run/scan/subtask=0/attempt=1/data"
OUTPUT = {
    "_sp=1/part-00000.parquet": b"one" * 100,
    "_sp=2/part-00000.parquet": b"two" * 7,
    "part-00001.parquet": b"",
}
WHO = {"stage": "scan", "subtask": 0, "attempt": 1}


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _store(objects: dict[str, bytes], content_token: str | None = "etag") -> MemoryBackend:
    store = MemoryBackend("s3://b/root", content_token=content_token)
    for rel, data in {**objects, "_SUCCESS": b""}.items():
        store.replace(f"{DATA}/{rel}", data)
    return store


def test_an_etag_manifest_is_built_from_one_listing_without_reading_a_byte() -> None:
    store = _store(OUTPUT)
    reads, listings, stats = store.reads, store.listings, store.stats
    manifest = build_manifest_in(store, DATA, **WHO)
    assert (store.reads, store.listings, store.stats) == (reads, listings + 1, stats)
    assert manifest["integrity"] == "etag"
    assert manifest["files"] == [
        {"path": "_sp=1/part-00000.parquet", "size": 300, "etag": _md5(OUTPUT["_sp=1/part-00000.parquet"]),
         "subpartition": 1},
        {"path": "_sp=2/part-00000.parquet", "size": 21, "etag": _md5(OUTPUT["_sp=2/part-00000.parquet"]),
         "subpartition": 2},
        {"path": "part-00001.parquet", "size": 0, "etag": _md5(b""), "subpartition": None}]
    assert manifest["bytes"] == 321
    # Verified from one listing as well: no HeadObject, no GetObject.
    verify_files_in(store, DATA, manifest["files"], **WHO)
    assert (store.reads, store.listings, store.stats) == (reads, listings + 2, stats)


def test_without_a_content_token_the_manifest_is_the_sha256_one(tmp_path: Path) -> None:
    store = _store(OUTPUT, content_token=None)
    for rel, data in OUTPUT.items():
        (tmp_path / DATA / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / DATA / rel).write_bytes(data)
    manifest = build_manifest_in(store, DATA, **WHO)
    assert "integrity" not in manifest and all("etag" not in f and f["sha256"] for f in manifest["files"])
    assert PosixBackend.content_token is None and S3Backend.content_token == "etag"
    assert json_document(build_manifest(tmp_path / DATA, **WHO)) == json_document(manifest)


@pytest.mark.parametrize("checksums", [True, False])
def test_verify_by_etag_finds_a_replaced_a_resized_and_a_missing_file(checksums: bool) -> None:
    store = _store(OUTPUT)
    files = build_manifest_in(store, DATA, **WHO)["files"]
    name = f"{DATA}/_sp=1/part-00000.parquet"
    shown = store.describe(name)

    store.replace(name, b"eno" * 100)  # the same size, other bytes: only the token tells
    if checksums:
        with pytest.raises(PartitionError, match=rf"^corrupt partition file {shown} \(stage 'scan' subtask 0 "
                                                 r"attempt 1\): checksum mismatch"):
            verify_files_in(store, DATA, files, **WHO)
    else:
        verify_files_in(store, DATA, files, checksums=False, **WHO)  # sizes only, as results.py asks

    store.objects[name] = b"one" * 100 + b"x"  # changed behind the store's back: resized
    with pytest.raises(PartitionError, match=r"size 301 != manifest 300"):
        verify_files_in(store, DATA, files, checksums=checksums, **WHO)

    store.objects[name] = b"eno" * 100  # behind the store's back, same size: a new token all the same
    if checksums:
        with pytest.raises(PartitionError, match="checksum mismatch"):
            verify_files_in(store, DATA, files, **WHO)

    del store.objects[name]
    with pytest.raises(PartitionError, match=rf"^missing partition file {shown} ") as err:
        verify_files_in(store, DATA, files, checksums=checksums, **WHO)
    assert (err.value.stage, err.value.subtask, err.value.attempt) == ("scan", 0, 1)


def test_old_sha256_and_mixed_entries_still_verify_and_an_entry_without_either_is_refused() -> None:
    old = build_manifest_in(_store(OUTPUT, content_token=None), DATA, **WHO)["files"]
    store = _store(OUTPUT)
    verify_files_in(store, DATA, old, **WHO)  # a manifest written before: read back and hashed as then
    mixed = [old[0], *build_manifest_in(store, DATA)["files"][1:]]
    verify_files_in(store, DATA, mixed, **WHO)
    store.replace(f"{DATA}/part-00001.parquet", b"late")
    with pytest.raises(PartitionError, match=r"part-00001.parquet .*size 4 != manifest 0"):
        verify_files_in(store, DATA, mixed, **WHO)

    bare = [{"path": "part-00001.parquet", "size": 0, "subpartition": None}]
    with pytest.raises(PartitionError, match=r"part-00001.parquet \(stage 'scan' subtask 0 attempt 1\) carries "
                                             "neither sha256 nor etag"):
        verify_files_in(store, DATA, bare, checksums=False, **WHO)


@pytest.fixture
def s3() -> Iterator[S3Backend]:
    """An S3Backend on a fresh prefix of moto's in-process bucket."""
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="store-etag")
        yield S3Backend(f"s3://store-etag/{uuid.uuid4().hex}", client=client)


def test_on_s3_manifests_carry_etags_and_verify_by_listing(s3: S3Backend) -> None:
    for rel, data in OUTPUT.items():
        s3.replace(f"{DATA}/{rel}", data)
    manifest = build_manifest_in(s3, DATA, **WHO)
    assert manifest["integrity"] == "etag"
    assert [f["etag"] for f in manifest["files"]] == [_md5(d) for d in OUTPUT.values()]
    verify_files_in(s3, DATA, manifest["files"], **WHO)

    # A manifest with SHA-256 entries (written before this change) still verifies on S3, by reading.
    sha = [{"path": f["path"], "size": f["size"], "sha256": hashlib.sha256(OUTPUT[f["path"]]).hexdigest(),
            "subpartition": f["subpartition"]} for f in manifest["files"]]
    verify_files_in(s3, DATA, sha, **WHO)

    s3.replace(f"{DATA}/_sp=2/part-00000.parquet", b"owt" * 7)
    for files in (manifest["files"], sha):
        with pytest.raises(PartitionError, match=r"_sp=2/part-00000.parquet .*checksum mismatch"):
            verify_files_in(s3, DATA, files, **WHO)
    s3.replace(f"{DATA}/_sp=2/part-00000.parquet", b"tw")
    with pytest.raises(PartitionError, match="size 2 != manifest 21"):
        verify_files_in(s3, DATA, manifest["files"], **WHO)
    s3._client.delete_object(Bucket=s3.bucket, Key=f"{s3.base}/{DATA}/_sp=2/part-00000.parquet")
    with pytest.raises(PartitionError, match=r"missing partition file .*_sp=2/part-00000.parquet"):
        verify_files_in(s3, DATA, manifest["files"], **WHO)


def _packed_file(subpartitions: list[int]) -> bytes:
    """A packed exchange file as pyarrow writes one: rows sorted by ``_sp``, small row groups."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"k": list(range(len(subpartitions))), "_sp": sorted(subpartitions)}), sink,
                   row_group_size=2)
    return sink.getvalue()


def test_a_packed_files_footer_and_subpartition_counts_come_from_one_open(tmp_path: Path) -> None:
    # On S3 the same pyarrow read goes through S3FileSystem: the S3 store's integration tests write packed files.
    store = PosixBackend(tmp_path)
    store.replace(f"{DATA}/part-0.parquet", _packed_file([3, 0, 3, 7, 3]))
    metadata, counts = store.parquet_value_counts(f"{DATA}/part-0.parquet", "_sp")
    assert metadata.num_rows == 5 and metadata.num_row_groups == 3
    assert counts == {0: 1, 3: 3, 7: 1}


def test_a_file_without_the_subpartition_column_is_refused_naming_it(tmp_path: Path) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"k": [1]}), sink)
    store = PosixBackend(tmp_path)
    store.replace(f"{DATA}/part-0.parquet", sink.getvalue())
    with pytest.raises(StoreError, match=r"part-0\.parquet has no column '_sp'"):
        store.parquet_value_counts(f"{DATA}/part-0.parquet", "_sp")
