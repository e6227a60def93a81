"""Airflow-level reruns: `airflow speculative rerun` invalidates exactly a region; a rerun reuses the rest.

The DAG is ``connect_q1`` (the example's Q1 on the session's warm Connect pool): what is tested is the
rerun's region and reuse, which do not depend on the target kind (on spark-submit targets the test
took 110 s, here 44 s).
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
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import TEST_ENV
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

AIRFLOW = str(Path(sys.executable).parent / "airflow")
STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])


def airflow(*args: str) -> str:
    done = subprocess.run([AIRFLOW, *args], capture_output=True, text=True, env=os.environ, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def last_json(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):])


DAG = "connect_q1"
# Not test_connect_spark's date: both write the same store and output directory.
DAY = pendulum.datetime(2026, 5, 11, tz="UTC")


def test_rerun_cli_reruns_the_subtask_and_its_consumers(airflow_db, tpch_data, connect_pool):
    run = load_dag(DAG, HERE / "dags").test(logical_date=DAY)
    assert run.state == "success"
    scan = StageLayout(STORE, DAG, run.run_id, "scan")
    aggregate = StageLayout(STORE, DAG, run.run_id, "aggregate")
    old_commit = read_json(aggregate.committed)

    narrow = last_json(airflow("speculative", "rerun", "-d", DAG, "-r", run.run_id, "--stage", "scan",
                               "--subtask", "1", "--no-downstream", "--dry-run", "-o", "json"))
    assert narrow["region"] == {"scan": [1]} and narrow["downstream"] == {}
    dry = airflow("speculative", "rerun", "-d", DAG, "-r", run.run_id, "--stage", "scan", "--subtask", "1",
                  "--dry-run")
    assert "  named:\n    stage scan: subtasks 1\n" in dry
    assert "transitively):\n    stage aggregate: subtasks 0\n" in dry
    assert read_json(scan.admitted(1)) is not None, "a dry run must not change anything"

    done = last_json(airflow("speculative", "rerun", "-d", DAG, "-r", run.run_id, "--stage", "scan",
                             "--subtask", "1", "-o", "json"))
    # By default the consumer of scan[1] (all_to_all: every aggregate subtask) reruns too.
    assert done["requested"] == {"scan": [1]} and done["downstream"] == {"aggregate": [0]}
    assert done["invalidated"] == {"scan": [1], "aggregate": [0]}
    assert done["cleared_tasks"] == ["aggregate", "scan"]
    assert read_json(scan.admitted(1)) is None and read_json(scan.admitted(0)) is not None
    assert read_json(aggregate.admitted(0)) is None
    assert not scan.committed.exists() and not aggregate.committed.exists()

    # Run the cleared tasks again in order (the scheduler would; `airflow tasks test` runs them inline).
    airflow("tasks", "test", DAG, "scan", run.run_id)
    assert scan.attempt_numbers(0) == [0], "the valid subtask must be reused, not rerun"
    assert scan.attempt_numbers(1) == [0, 1]
    assert read_json(scan.admitted(1))["attempt"] == 1
    assert read_json(scan.committed)["subtasks"]["1"]["attempt"] == 1
    assert any(e["event"] == "rerun_invalidated" for e in read_jsonl(scan.journal))

    airflow("tasks", "test", DAG, "aggregate", run.run_id)
    # The consumer was recomputed, and from the new producer output: its plan reads scan[1] attempt 1.
    assert aggregate.attempt_numbers(0) == [0, 1] and read_json(aggregate.admitted(0))["attempt"] == 1
    # The plan names producer ranges only; the files an attempt resolves come from scan's new commit.
    files = StageContext(read_json(aggregate.plan), 0, 1, "connect-a").exchange_files("partials")
    assert any("/subtask=1/attempt=1/" in f for f in files) and any("/subtask=0/attempt=0/" in f for f in files)
    assert not any("/subtask=1/attempt=0/" in f for f in files)
    new_commit = read_json(aggregate.committed)
    assert new_commit["subtasks"]["0"]["attempt"] == 1 and new_commit["committed_at"] > old_commit["committed_at"]

    out = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / DAG / DAY.to_date_string()
    assert_q1_equal(read_q1_output(out), duckdb_q1(tpch_data))


def test_rerun_cli_names_bad_input(airflow_db):
    bad = subprocess.run([AIRFLOW, "speculative", "rerun", "-d", "nope", "-r", "nope", "--stage", "x"],
                         capture_output=True, text=True, env=os.environ, timeout=120)
    assert bad.returncode == 1 and "no speculative stages recorded for dag 'nope'" in bad.stderr
