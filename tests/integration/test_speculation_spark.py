"""Real Spark through dag.test(): a 4x slow target, a speculative attempt wins, the result stays exact."""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import STATSD_PORT, TEST_ENV
from tests.integration.dag_faults import SPEC_Q1
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.spark_helpers import HERE, StatsdCapture, group_processes, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture
def statsd():
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

    capture = StatsdCapture(STATSD_PORT)
    # What the task runner and the triggerer do at start-up; dag.test() runs both in this process.
    stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    yield capture
    capture.close()


def test_slow_target_is_beaten_by_a_speculative_attempt(airflow_db, tpch_data, statsd):
    dag = load_dag("spec_q1", HERE / "dags")
    with injected(SPEC_Q1):  # local-b 4x slower: what the copy on local-a must beat
        run = dag.test(logical_date=pendulum.datetime(2026, 3, 1, tz="UTC"))
    assert run.state == "success"

    store = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
    report = run_report(store, "spec_q1", run.run_id)
    scan = next(s for s in report["stages"] if s["stage"] == "scan")
    aggregate = next(s for s in report["stages"] if s["stage"] == "aggregate")

    # Subtask 1 is the one placed on the slow target (2 slots on local-a, 1 on local-b).
    slow = scan["subtasks"][1]
    original, copy = slow["attempts"][0], slow["attempts"][1]
    assert (original["target"], original["state"], original["admitted"]) == ("local-b", "CANCELED", False)
    assert (copy["target"], copy["state"], copy["admitted"], copy["speculative"]) == (
        "local-a", "FINISHED", True, True)
    assert len(slow["attempts"]) == 2
    for sub in (scan["subtasks"][0], scan["subtasks"][2], aggregate["subtasks"][0]):
        assert [(a["target"], a["state"], a["admitted"]) for a in sub["attempts"]] == [("local-a", "FINISHED", True)]

    # The loser's driver is really gone and its output removed.
    layout = StageLayout(store, "spec_q1", run.run_id, "scan")
    loser_status = read_json(layout.status(1, 0))
    assert group_processes(loser_status["pgid"]) == []
    assert not layout.data(1, 0).exists() and not layout.manifest(1, 0).exists()
    assert layout.manifest(1, 1).exists()

    # The slow node was blocked, and stayed blocked for the next stage (run-scoped blocklist).
    assert any(e["event"] == "block_node" and e["node"] == "local-b" for e in read_jsonl(layout.journal))
    assert "local-b" in scan["blocked_nodes"]

    # FLIP-168 metrics: in the stage summary and sent through Airflow's StatsD.
    summary = read_json(layout.summary)
    assert summary["numEffectiveSpeculativeExecutions"] == 1
    assert summary["peakSlowExecutionVertices"] == 1
    assert aggregate["numEffectiveSpeculativeExecutions"] == 0
    assert 1.0 in statsd.gauges("spec_q1.scan.numSlowExecutionVertices")
    assert statsd.gauges("spec_q1.scan.numEffectiveSpeculativeExecutions")[-1] == 1.0

    # The committed result is still exactly TPC-H Q1.
    output = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "spec_q1" / "2026-03-01"
    assert_q1_equal(read_q1_output(output), duckdb_q1(tpch_data))
    manifest = json.loads((output / "_SUCCESS").read_text())
    assert [(f["subtask"], f["attempt"]) for f in manifest["files"]] == [(0, 0)]
