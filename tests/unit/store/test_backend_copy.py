"""StoreBackend.copy_from: a whole object of one backend published under a name of another, with its checksum."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import moto
import pytest

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend, UnsafeStoreNameError
from tests.unit.store.memory import MemoryBackend

BUCKET = "copy-sink"
DATA = bytes(range(256)) * 5000  # over one read chunk, so a streamed copy takes several


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def s3() -> Iterator[None]:
    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield


def s3_backend(prefix: str) -> tuple[S3Backend, list[str]]:
    """A backend on the in-process bucket and the S3 operations its client sends, in order."""
    client = boto3.client("s3", region_name="us-east-1")
    calls: list[str] = []
    client.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
    return S3Backend(f"s3://{BUCKET}/{prefix}", client=client), calls


def test_posix_copy_streams_into_place_and_returns_the_sha256(tmp_path: Path) -> None:
    source = PosixBackend(tmp_path / "src")
    source.replace("a/part-0.parquet", DATA)
    target = PosixBackend(tmp_path / "dst")
    target.replace("out/x.parquet", b"old")

    assert target.copy_from("out/x.parquet", source, "a/part-0.parquet") == sha(DATA)
    assert (tmp_path / "dst/out/x.parquet").read_bytes() == DATA
    assert sorted(p.name for p in (tmp_path / "dst/out").iterdir()) == ["x.parquet"]  # no temporary left


def test_memory_copy_reads_the_source_and_replaces_the_name() -> None:
    source, target = MemoryBackend(), MemoryBackend()
    source.replace("d/f", b"bytes")
    assert target.copy_from("v/f", source, "d/f") == sha(b"bytes")
    assert target.read("v/f") == b"bytes"


def test_copy_of_a_missing_object_names_it_and_writes_nothing(tmp_path: Path) -> None:
    target = MemoryBackend()
    with pytest.raises(StoreError, match=r"d/missing.*does not exist"):
        target.copy_from("v/f", PosixBackend(tmp_path), "d/missing")
    assert target.objects == {}


def test_copy_refuses_an_unsafe_target_name_and_the_ownership_marker() -> None:
    source = MemoryBackend()
    source.replace("d/f", b"x")
    with pytest.raises(UnsafeStoreNameError):
        MemoryBackend().copy_from("../f", source, "d/f")
    with pytest.raises(UnsafeStoreNameError):
        MemoryBackend().copy_from("p/_owner.json", source, "d/f")


def test_s3_to_s3_on_one_endpoint_is_one_server_side_copy_with_the_service_checksum(s3: None) -> None:
    store, _ = s3_backend("store")
    store.replace("run/data/part-0.parquet", DATA)
    sink, calls = s3_backend("")

    assert sink.copy_from("out/_v=1/part-00000-000.parquet", store, "run/data/part-0.parquet") == sha(DATA)
    assert "CopyObject" in calls and "PutObject" not in calls and "GetObject" not in calls
    assert sink.read("out/_v=1/part-00000-000.parquet") == DATA


def test_posix_to_s3_is_a_streamed_upload_hashed_on_the_way(s3: None, tmp_path: Path) -> None:
    source = PosixBackend(tmp_path)
    source.replace("data/part-0.parquet", DATA)
    sink, calls = s3_backend("sinks")

    assert sink.copy_from("out/f.parquet", source, "data/part-0.parquet") == sha(DATA)
    assert "CopyObject" not in calls
    assert sink.read("out/f.parquet") == DATA


def test_s3_copy_errors_name_the_target_and_the_code_only(s3: None) -> None:
    store, _ = s3_backend("store")
    store.replace("d/f", b"x")
    missing_bucket = S3Backend("s3://no-such-bucket-here", client=boto3.client("s3", region_name="us-east-1"))
    with pytest.raises(StoreError, match=r"cannot write s3://no-such-bucket-here/v/f: NoSuchBucket"):
        missing_bucket.copy_from("v/f", store, "d/f")
