"""Sinks publish Airflow assets: outlets at parse time, one event with the commit's summary per commit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_speculative import ParquetSink, Pipeline, parquet_source
from airflow_provider_speculative.exceptions import PipelineError
from airflow_provider_speculative.sinks.postgres import PostgresSink
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
from tests.factories import FakeTI


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[1]"}')
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", str(tmp_path / "store"))
    (tmp_path / "src").mkdir()
    for i in range(2):
        pq.write_table(pa.table({"k": [i]}), tmp_path / "src" / f"part-{i}.parquet")
    (tmp_path / "app.py").write_text("# stage application\n")
    return tmp_path


def _operator(tmp_path: Path, sink: Any, **kwargs: Any) -> Any:
    with Pipeline("p") as pipeline:
        stage = pipeline.stage("final", application=str(tmp_path / "app.py"), parallelism=2,
                               inputs={"src": parquet_source(str(tmp_path / "src"))}, sink=sink, **kwargs)
    return stage.task


def test_parquet_sink_asset_is_the_fixed_part_of_its_path() -> None:
    assert ParquetSink("/out/q1/{{ ds }}").asset_uri() == "file:///out/q1"
    assert ParquetSink("/out/q1").asset_uri() == "file:///out/q1"
    assert ParquetSink("/out/q1_{{ ds }}/x").asset_uri() == "file:///out"
    assert ParquetSink("{{ var.value.out }}/q1").asset_uri() is None
    assert ParquetSink("/{{ ds }}").asset_uri() is None


def test_postgres_sink_asset_needs_the_database_and_validates_as_an_airflow_asset() -> None:
    assert PostgresSink("public.sales").asset_uri() is None
    sink = PostgresSink("mart.sales", asset_uri="postgres://127.0.0.1:5432/warehouse")
    assert sink.asset_uri() == "postgres://127.0.0.1:5432/warehouse/mart/sales"
    assert Asset(uri=sink.asset_uri()).uri == "postgres://127.0.0.1:5432/warehouse/mart/sales"
    assert PostgresSink("sales", asset_uri="postgres://db/warehouse").asset_uri() == \
        "postgres://db/warehouse/public/sales"
    assert "asset_uri" not in sink.describe()  # naming the asset is no part of the plan's fingerprint


@pytest.mark.parametrize("uri,problem", [("mysql://h/db", "expected postgres://"),
                                         ("postgres://u:secret@h/db", "password"),
                                         ("postgres://h/db/s", "expected postgres://")])
def test_postgres_asset_uri_is_checked_at_parse_time(uri: str, problem: str) -> None:
    with pytest.raises(PipelineError, match=problem):
        PostgresSink("mart.sales", asset_uri=uri).validate("pipeline 'p', stage 'final'")


def test_a_stage_with_a_sink_declares_its_asset_as_an_outlet_next_to_the_users(env: Path) -> None:
    mine = Asset(uri="file:///elsewhere")
    op = _operator(env, ParquetSink(str(env / "out") + "/{{ ds }}"), outlets=[mine])
    assert op.outlets == [mine, Asset(uri=(env / "out").as_uri())]
    assert _operator(env, ParquetSink("{{ var.value.out }}")).outlets == []


def _context(events: OutletEventAccessors, **extra: Any) -> dict[str, Any]:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": "r1", "ti": FakeTI(),
            "logical_date": pendulum.datetime(2026, 1, 1, 6, tz="UTC"), "dag_run": SimpleNamespace(conf={}),
            "outlet_events": events, **extra}


def _commit(env: Path, op: Any, events: OutletEventAccessors, **extra: Any) -> dict[str, Any]:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context(events, **extra))
    layout = StageLayout(env / "store", "d", "r1", "final")
    for subtask, attempt in ((0, 0), (1, 1)):
        atomic_write_json(layout.claim(subtask, attempt), {"target": "local-a", "created_at": 1.0})
        data = layout.data(subtask, attempt)
        data.mkdir(parents=True)
        pq.write_table(pa.table({"k": [subtask] * 3}), data / "part-0.parquet")
        write_manifest(layout.manifest(subtask, attempt),
                       build_manifest(data, stage="final", subtask=subtask, attempt=attempt, records=3))
        atomic_write_json(layout.admitted(subtask), {"attempt": attempt, "at": 1.0})
    return op.execute_complete(_context(events, **extra), {
        "status": "success", "plan_path": deferred.value.trigger.plan_path, "admitted": {"0": 0, "1": 1},
        "summary": {"numEffectiveSpeculativeExecutions": 1, "numSlowExecutionVertices": 1}})


def test_the_commit_is_described_in_the_asset_events_extra(env: Path) -> None:
    op = _operator(env, ParquetSink(str(env / "out") + "/{{ ds }}"))
    op.sink_args = {"path": str(env / "out" / "2026-01-01")}  # as rendered by the task runner
    events = OutletEventAccessors()
    _commit(env, op, events)
    accessor = events[Asset(uri=(env / "out").as_uri())]
    assert accessor.extra == {
        "dag_id": "d", "run_id": "r1", "stage": "final", "logical_date": "2026-01-01T06:00:00+00:00",
        "records": 6, "files": 2, "location": str(env / "out" / "2026-01-01"),
        "attempts_admitted": {"0": 0, "1": 1}, "numEffectiveSpeculativeExecutions": 1,
        "numSlowExecutionVertices": 1}
    assert accessor.partition_keys == set()  # unpartitioned by default: plain schedule=[asset] DAGs run


def test_asset_partitioned_stages_key_the_event_by_logical_date(env: Path) -> None:
    op = _operator(env, ParquetSink(str(env / "out") + "/{{ ds }}"), asset_partitioned=True)
    events = OutletEventAccessors()
    _commit(env, op, events)
    assert events[Asset(uri=(env / "out").as_uri())].partition_keys == {"2026-01-01T06:00:00"}


def test_a_partitioned_producer_run_passes_its_own_partition_key_on(env: Path) -> None:
    op = _operator(env, ParquetSink(str(env / "out") + "/{{ ds }}"), asset_partitioned=True)
    events = OutletEventAccessors()
    _commit(env, op, events, partition_key="region=eu")
    assert events[Asset(uri=(env / "out").as_uri())].partition_keys == {"region=eu"}
