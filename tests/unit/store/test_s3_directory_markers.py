"""Directory markers on S3 (keys ending in ``/``, which s3a's committers and consoles create) are no store names."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import moto
import pytest

from airflow_provider_speculative.store.backend import S3Backend

BUCKET = "markers"


@pytest.fixture
def store() -> Iterator[S3Backend]:
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        backend = S3Backend(f"s3://{BUCKET}/root", client=client)
        backend.claim("d/r")
        backend.replace("d/r/data/_sp=0/part-0.parquet", b"x")
        for folder in ("root/d/r/data/", "root/d/r/data/_sp=0/", "root/d/r/empty/"):
            client.put_object(Bucket=BUCKET, Key=folder, Body=b"")
        yield backend


def test_listings_never_name_a_directory_marker(store: S3Backend) -> None:
    assert store.list_names("d/r/data") == ["d/r/data/_sp=0/part-0.parquet"]
    assert [info.name for info in store.stat_all("d/r/data")] == ["d/r/data/_sp=0/part-0.parquet"]
    assert store.children("d/r/data") == ["_sp=0/"]
    assert "empty/" in store.children("d/r") and "" not in store.children("d/r")


def test_deleting_a_prefix_removes_its_directory_markers_too(store: S3Backend) -> None:
    store.delete_prefix("d/r")
    left = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket=BUCKET).get("Contents", [])
    assert [o["Key"] for o in left if o["Key"].startswith("root/d/r")] == []
