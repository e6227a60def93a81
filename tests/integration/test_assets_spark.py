"""Real Spark and Airflow (dag.test()): a sink's commit is an asset event with its summary; a sensor DAG reads it."""

from __future__ import annotations

from pathlib import Path

import pendulum
import pytest

from tests.conftest import TEST_ENV
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_commit_publishes_an_asset_event_and_a_sensor_dag_reads_the_output(airflow_db: Path, tpch_data: Path):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    day = pendulum.datetime(2026, 7, 1, tz="UTC")
    run = load_dag("small_q1", HERE / "dags").test(logical_date=day)
    assert run.state == "success"
    output = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "small_q1"
    with create_session() as session:
        events = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                  .filter(AssetModel.uri == output.as_uri(), AssetEvent.source_run_id == run.run_id).all())
        assert len(events) == 1
        extra, partition = dict(events[0].extra), events[0].partition_key
    assert partition is None  # not asset_partitioned: plain schedule=[asset] consumers are queued
    assert extra["dag_id"] == "small_q1" and extra["stage"] == "aggregate" and extra["run_id"] == run.run_id
    assert extra["logical_date"] == day.isoformat() and extra["location"] == str(output / "2026-07-01")
    assert extra["files"] >= 1 and extra["attempts_admitted"] == {"0": 0}
    assert extra["numEffectiveSpeculativeExecutions"] == 0

    report = load_dag("small_q1_report", HERE / "dags").test(logical_date=day)
    assert report.state == "success"
    ti = next(t for t in report.get_task_instances() if t.task_id == "report")
    result = ti.xcom_pull(task_ids="report")
    # TPC-H Q1 has 4 (returnflag, linestatus) groups; the asset event counted the same records.
    assert result == {"run_id": run.run_id, "rows": 4, "path": str(output / "2026-07-01")}
    assert extra["records"] == 4
