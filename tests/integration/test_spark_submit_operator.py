"""SpeculativeSparkSubmitOperator on real Spark through dag.test(): an unmodified PySpark script, run once.

The script (tests/integration/apps/plain_q1.py) knows nothing of the provider: it builds its session with
``SparkSession.builder.getOrCreate()`` and writes TPC-H Q1 with ``df.write``. The task commits exactly one
attempt, that attempt's manifest lists no file, and the script's own output equals DuckDB's Q1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pendulum
import pytest

from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import TEST_ENV
from tests.integration.q1 import assert_q1_equal, duckdb_q1, output_decimal_scales, read_q1_output
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
DAY = pendulum.datetime(2026, 6, 1, tz="UTC")


def test_an_unmodified_script_runs_once_and_writes_its_own_output(airflow_db, tpch_data):
    output = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "unmodified_q1"
    shutil.rmtree(output, ignore_errors=True)
    dag = load_dag("unmodified_q1", HERE / "dags")
    run = dag.test(logical_date=DAY)
    assert run.state == "success"
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {"q1": "success"}

    # The script's own output, where it wrote it, equals DuckDB's Q1 over the same input.
    written = output / DAY.to_date_string()
    assert_q1_equal(read_q1_output(written), duckdb_q1(tpch_data), scales=output_decimal_scales(written))

    # Exactly one attempt ran, not speculative, and the commit names it with no file of the provider's.
    layout = StageLayout(STORE, "unmodified_q1", run.run_id, "q1")
    plan = read_json(layout.plan)
    assert plan["parallelism"] == 1 and plan["config"]["enabled"] is False
    assert layout.attempt_numbers(0) == [0]
    assert read_json(layout.claim(0, 0))["speculative"] is False
    assert read_json(layout.status(0, 0))["state"] == "FINISHED"
    assert read_json(layout.manifest(0, 0))["files"] == []
    committed = read_json(layout.committed)
    assert {k: v["attempt"] for k, v in committed["subtasks"].items()} == {"0": 0}
    assert not layout.data(0, 0).exists()
    # The attempt's Spark application (its id reaches the spark_app_ids XCom) ran the script in its session.
    assert str(read_json(layout.heartbeat(0, 0))["app_id"]).startswith("local-")
