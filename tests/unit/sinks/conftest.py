"""Fixtures of the sink tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import moto
import pytest

from airflow_provider_speculative.sinks import parquet_s3
from airflow_provider_speculative.store.backend import S3Backend, StoreBackend


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """An in-process S3 with buckets ``lake`` (the sink) and ``store``; yields the sink client's operations."""
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="lake")
        client.create_bucket(Bucket="store")
        calls: list[str] = []

        def open_backend(location: Any, owner: str, credentials: Any) -> StoreBackend:
            sink_client = boto3.client("s3", region_name="us-east-1")
            sink_client.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
            return S3Backend(f"s3://{location.bucket}", owner=owner, client=sink_client)

        monkeypatch.setattr(parquet_s3, "open_sink_backend", open_backend)
        yield calls
