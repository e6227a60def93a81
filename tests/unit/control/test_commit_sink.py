"""control/commit.py hands a sink's finalize the store, each attempt's data name and lazy S3 credentials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control.commit import sink_finalizer
from airflow_provider_speculative.sinks.base import FinalizationContext, InitializationContext, Sink, SinkWriter
from airflow_provider_speculative.store.layout import StageLayout

SEEN: list[FinalizationContext] = []


class RecordingSink(Sink):
    """A sink that keeps the context finalize got."""

    def create_writer(self, context: InitializationContext) -> SinkWriter:
        raise NotImplementedError

    def finalize_global(self, context: FinalizationContext) -> dict[str, Any]:
        SEEN.append(context)
        return {"sink": "recording"}

    def describe(self) -> dict[str, Any]:
        return {}


def test_finalize_gets_the_store_the_data_names_and_credentials_resolved_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = StageLayout(tmp_path / "store", "dag", "run", "write")
    plan: Any = {"output": {"sink": RecordingSink().to_json()}, "parallelism": 1, "dag_id": "dag", "run_id": "run",
                 "stage": "write", "pipeline": "orders", "config": {"s3_conn_id": ""}}
    record = {"subtasks": {"0": {"files": [], "records": 0, "sink": {"write_id": "w"}}}}
    finalize = sink_finalizer(plan, layout)
    assert finalize is not None
    SEEN.clear()

    assert finalize({0: 3}, record) == {"sink": "recording"}

    [context] = SEEN
    assert context.store is layout.store and context.extra["pipeline"] == "orders"
    assert context.attempts[0].data_name == layout.name(layout.data(0, 3))
    assert context.attempts[0].data_dir == layout.data(0, 3) and context.attempts[0].sink_info == {"write_id": "w"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    credentials = context.extra["s3_credentials"]()  # empty s3_conn_id: the AWS environment
    assert (credentials.access_key, credentials.endpoint_url) == ("AKIDEXAMPLE", "http://127.0.0.1:9")
