"""Two pipelines with the same stage names in one DAG (``task_group=True``), run by real Airflow on real Spark.

Each pipeline's stages run in their own store directories, commit their own result (equal to DuckDB's),
and are found by task id from the CLI; a bare stage name that both pipelines have is refused as ambiguous.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pendulum
import pytest

from airflow_provider_speculative.runtime.context import StageContext
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import TEST_ENV
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

AIRFLOW = str(Path(sys.executable).parent / "airflow")
STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
DAG = "connect_grouped"
DAY = pendulum.datetime(2026, 5, 21, tz="UTC")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIRFLOW, "speculative", *args], capture_output=True, text=True, env=os.environ,
                          timeout=300)


def test_two_grouped_pipelines_with_the_same_stage_names(airflow_db, tpch_data, connect_pool):
    dag = load_dag(DAG, HERE / "dags")
    assert sorted(dag.task_group.children) == ["east", "west"]
    assert sorted(dag.task_ids) == ["east.aggregate", "east.scan", "west.aggregate", "west.scan"]
    run = dag.test(logical_date=DAY)
    assert run.state == "success"
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == dict.fromkeys(dag.task_ids, "success")

    want = duckdb_q1(tpch_data)
    for name in ("east", "west"):
        scan = StageLayout(STORE, DAG, run.run_id, f"{name}.scan")
        aggregate = StageLayout(STORE, DAG, run.run_id, f"{name}.aggregate")
        plan = read_json(scan.plan)
        # The stage keeps its bare name; only its directory carries the pipeline.
        assert plan["stage"] == "scan" and read_json(aggregate.plan)["stage"] == "aggregate"
        assert read_json(scan.committed) is not None and read_json(aggregate.committed) is not None
        # The consumer read its own pipeline's producer only.
        data = [part["data"] for part in read_json(scan.committed)["subtasks"].values()]
        assert len(data) == 2 and all(f"/{name}.scan/" in d for d in data)
        admitted = read_json(aggregate.admitted(0))["attempt"]
        files = StageContext(read_json(aggregate.plan), 0, admitted, "connect-a").exchange_files("partials")
        assert files and all(f"/{name}.scan/" in f for f in files)
        out = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / DAG / name / DAY.to_date_string()
        assert_q1_equal(read_q1_output(out), want)
    assert not (STORE / DAG / run.run_id / "scan").exists()

    status = cli("status", "-d", DAG, "-r", run.run_id, "--stage", "west.scan", "-o", "json")
    assert status.returncode == 0, status.stderr[-2000:]
    report = json.loads(status.stdout[status.stdout.index("{"):])
    assert json.dumps(report).count("west") >= 1 and "east" not in json.dumps(report.get("stages", report))
    ambiguous = cli("status", "-d", DAG, "-r", run.run_id, "--stage", "scan")
    assert ambiguous.returncode != 0 and "ambiguous" in (ambiguous.stderr + ambiguous.stdout)
    region = cli("rerun", "-d", DAG, "-r", run.run_id, "--stage", "east.scan", "--subtask", "1", "--dry-run",
                 "-o", "json")
    assert region.returncode == 0, region.stderr[-2000:]
    dry = json.loads(region.stdout[region.stdout.index("{"):])
    # The region is the named subtask and its consumer in the same pipeline, by task id.
    assert dry["region"] == {"east.scan": [1], "east.aggregate": [0]}
    assert "west" not in json.dumps(dry)
