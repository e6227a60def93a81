"""OpenLineage through Airflow's own provider: a real `airflow dags test` with the file transport.

Each stage's COMPLETE event names what it read and wrote: the scan its lineitem source and its exchange,
the aggregate the exchange, the source it came from (so a sink's event carries the lineage end to end)
and the sink's dataset, the same one the stage's Airflow asset names. Every attempt's Spark session got
the parent job of its task run (the run id of the task's own OpenLineage events).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, TEST_ENV

pytestmark = [pytest.mark.timeout(900)]


def test_each_stage_reports_its_inputs_and_outputs(airflow_db: Path, tpch_data: Path, tmp_path: Path) -> None:
    events_file = tmp_path / "openlineage.jsonl"
    env = {**os.environ, **TEST_ENV,
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                          "append": True}),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "speculative-test",
           # As the apache-spark provider reads them: every attempt's Spark conf names its parent task run.
           "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "true",
           "AIRFLOW__OPENLINEAGE__SPARK_INJECT_TRANSPORT_INFO": "true"}
    airflow = str(Path(sys.executable).parent / "airflow")
    result = subprocess.run([airflow, "dags", "test", "small_q1", "2026-02-11"], env=env, capture_output=True,
                            text=True, timeout=800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    complete = {e["job"]["name"]: e for e in events if e["eventType"] == "COMPLETE" and "." in e["job"]["name"]}
    assert set(complete) >= {"small_q1.scan", "small_q1.aggregate"}, sorted(complete)

    def names(event: dict, side: str) -> set[tuple[str, str]]:
        return {(d["namespace"], d["name"]) for d in event[side]}

    source = ("file", str(DATA))
    exchange = ("speculative", "small_q1/scan")
    assert names(complete["small_q1.scan"], "inputs") == {source}
    assert names(complete["small_q1.scan"], "outputs") == {exchange}
    assert names(complete["small_q1.aggregate"], "inputs") == {source, exchange}
    sink = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "small_q1"
    assert names(complete["small_q1.aggregate"], "outputs") == {("file", str(sink))}

    # Each attempt's Spark session was opened with the task run as its OpenLineage parent.
    store = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"]) / "small_q1"
    (run_dir,) = {p.parent.parent for p in store.glob("*/scan/plan.json")
                  if str(json.loads(p.read_text()).get("logical_date", "")).startswith("2026-02-11")}
    for task in ("scan", "aggregate"):
        run_id = complete[f"small_q1.{task}"]["run"]["runId"]
        logs = list(run_dir.glob(f"{task}/subtask=*/attempt=*/spark-submit.log"))
        assert logs, f"no attempt log of {task} under {run_dir}"
        for log in logs:
            assert f"(OpenLineage parent run {run_id})" in log.read_text(), log
