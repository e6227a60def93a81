"""End to end as users deploy it: PostgreSQL + LocalExecutor, api-server, scheduler, dag-processor, triggerer.

The example DAG ``dags/tpch_q1.py`` is triggered through the CLI, its two stages run as real Spark attempts
(clients of the session's warm Spark Connect servers) launched by the stage controller in the triggerer, and
the committed output must equal DuckDB's TPC-H Q1 over the same lineitem files. ``dags/tpch_q1_report.py``
is triggered first: its StageOutputSensor defers in the triggerer until tpch_q1's aggregate commits, then
reads the output; the commit is recorded as an asset event with its summary. Then the six-stage Q3 example
(``dags/tpch_q3.py``) runs and must equal DuckDB; its consumers wait in the triggerer from the run's start
and launch only after every producer committed (the gaps are printed; bench/warm.py measures them), and its
sink records its asset event through the api-server (connection ``speculative_api``), with no worker run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_speculative.devtools.localcluster import connection_definitions, targets_json
from tests.integration.airflow_cluster import (
    LINEITEM,
    REPO,
    AirflowCluster,
    PostgresDatabase,
    describe,
    is_spark,
    parse_json_output,
    processes_mentioning,
    wait_until,
)
from tests.integration.connect_runner import ConnectPool
from tests.integration.q1 import assert_q1_equal, duckdb_q1, output_decimal_scales, read_q1_output
from tests.integration.q3 import duckdb_q3, q3_difference, read_q3_output

DAGS = REPO / "dags"

DAG_ID = "tpch_q1"
Q3_DAG_ID = "tpch_q3"
REPORT_DAG_ID = "tpch_q1_report"
LOGICAL_DATE = "2026-01-01T00:00:00+00:00"
DS = "2026-01-01"


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def lineitem() -> Path:
    if not sorted(LINEITEM.glob("lineitem.*.parquet")):
        pytest.skip(f"TPC-H lineitem data missing at {LINEITEM}: run `make data` first")
    return LINEITEM


@pytest.fixture
def postgres_db() -> Iterator[PostgresDatabase]:
    db = PostgresDatabase()
    db.create_migrated()
    yield db
    db.drop()


@pytest.fixture
def tpch(tmp_path: Path, lineitem: Path) -> Path:
    """Q3's tables: the shared lineitem parts (linked) beside customer and orders at scale factor 0.1."""
    import subprocess
    import sys

    tpch = tmp_path / "tpch"
    tpch.mkdir()
    (tpch / "lineitem").symlink_to(lineitem, target_is_directory=True)
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", "0.1", "--tables",
                    "customer,orders", "--parts", "4", "--output-dir", str(tpch)], check=True, capture_output=True)
    return tpch


@pytest.fixture
def deployment(tmp_path: Path, postgres_db: PostgresDatabase, tpch: Path,
               shared_connect_pool: ConnectPool) -> Iterator[AirflowCluster]:
    """Migrated DB, then api-server, scheduler, dag-processor and triggerer, all healthy; torn down after.

    The stages run on the session's warm Spark Connect pool, as the deployment benchmark (bench/warm.py d)
    does; spark-submit targets through the real scheduler are test_e2e_recovery's.
    """
    servers = list(shared_connect_pool.servers)
    # Admin API access: the test reads task states, XComs and asset events through the REST API.
    dep = AirflowCluster(tmp_path, postgres_db.url, dags_folder=DAGS, data=LINEITEM,
                         extra_env={"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                                    "SPECULATIVE_EXAMPLE_TPCH": str(tpch),
                                    **connection_definitions(servers),
                                    "AIRFLOW__SPECULATIVE__TARGETS": targets_json(servers)})
    try:
        dep.start_all()
        dep.wait_healthy()
        yield dep
    finally:
        # Whatever happened, leave no Spark driver behind (the test asserts there is none on success).
        dep.shutdown()


# -- the test -----------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_tpch_q1_runs_under_scheduler_and_triggerer(lineitem: Path, deployment: AirflowCluster, tmp_path: Path,
                                                    tpch: Path):
    try:
        run_and_check(deployment, lineitem, tmp_path)
        run_q3_and_check_boundaries(deployment, tpch, tmp_path)
        check_no_leftovers(deployment, tmp_path)
    except BaseException:  # also pytest-timeout's failure: print what makes it diagnosable
        print(f"\n{deployment.diagnostics()}")
        raise


def run_and_check(dep: AirflowCluster, lineitem: Path, tmp_path: Path) -> None:
    """Trigger the example DAG, wait for its run, check output, store, XCom and asset event."""
    started = time.monotonic()

    dep.wait_dag(DAG_ID)

    # The downstream report first: its sensor must wait (deferred, in the triggerer) for the commit.
    dep.wait_dag(REPORT_DAG_ID)
    dep.unpause(REPORT_DAG_ID)
    report_run_id = dep.trigger(REPORT_DAG_ID, LOGICAL_DATE)

    def sensor_deferred() -> bool:
        dep.check_alive()
        state = dep.task_instances(REPORT_DAG_ID, report_run_id).get("wait_for_q1", {}).get("state")
        assert state not in ("success", "failed", "skipped"), f"the sensor ended ({state}) before tpch_q1 ran"
        return state == "deferred"

    wait_until(sensor_deferred, 240, "the StageOutputSensor to defer", interval=1)

    # The example as a user starts it: unpaused and triggered through the CLI (the other DAGs through the API).
    dep.cli("dags", "unpause", DAG_ID)
    triggered = dep.cli_json("dags", "trigger", DAG_ID, "--logical-date", LOGICAL_DATE)
    run = triggered[0] if isinstance(triggered, list) else triggered
    run_id = run.get("dag_run_id") or run["run_id"]

    final = dep.wait_runs_finished(DAG_ID, [run_id], 600)[run_id]
    print(f"\n{DAG_ID} run {run_id}: {final['state']} after {time.monotonic() - started:.0f}s "
          f"(trigger to finish, including DAG parsing)")
    assert final["state"] == "success", f"run {run_id} is {final['state']}"

    # The committed sink output: a _SUCCESS manifest and exactly TPC-H Q1.
    output = tmp_path / "output" / DAG_ID / DS
    assert output.is_dir(), f"{output} was not committed"
    manifest = json.loads((output / "_SUCCESS").read_text())
    assert manifest["dag_id"] == DAG_ID and manifest["run_id"] == run_id
    assert sorted(f["path"] for f in manifest["files"]) == sorted(
        p.name for p in output.glob("*.parquet") if not p.name.startswith((".", "_")))
    assert_q1_equal(read_q1_output(output), duckdb_q1(lineitem), scales=output_decimal_scales(output))

    # The store, as the CLI reports it: both stages, one admitted FINISHED attempt per subtask.
    status = dep.cli("speculative", "status", "--dag-id", DAG_ID, "--run-id", run_id, "--output", "json")
    report = parse_json_output(status.stdout, "airflow speculative status")
    stages = {s["stage"]: s for s in report["stages"]}
    assert [s["stage"] for s in report["stages"]] == ["scan", "aggregate"]
    assert {name: s["parallelism"] for name, s in stages.items()} == {"scan": 8, "aggregate": 2}
    for name, stage in stages.items():
        assert stage["committed"], f"stage {name} not committed"
        assert len(stage["subtasks"]) == stage["parallelism"]
        for sub in stage["subtasks"]:
            attempts = [(a["attempt"], a["state"], a["admitted"], a["speculative"]) for a in sub["attempts"]]
            assert attempts == [(0, "FINISHED", True, False)], f"stage {name} subtask {sub['subtask']}: {attempts}"
            assert sub["admitted"] == 0

    # Both stages started in the triggerer (start_from_trigger: planned there, no worker before the commit) and
    # were committed by their trigger; scan ended its task there with the summary as XCom, aggregate (a sink
    # asset outlet) resumed on a worker only to publish the asset event.
    run_dir = next(p for p in (dep.store / DAG_ID).iterdir() if p.is_dir())
    committed_by = {stage: [e.get("by") for e in map(json.loads, (run_dir / stage / "journal.jsonl").open())
                            if e["event"] == "finalize_done"] for stage in ("scan", "aggregate")}
    assert committed_by == {"scan": ["triggerer"], "aggregate": ["triggerer"]}, committed_by
    scan_xcom = dep.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/scan/"
                               "xcomEntries/return_value?deserialize=true")
    scan_value = scan_xcom["value"] if isinstance(scan_xcom["value"], dict) else json.loads(scan_xcom["value"])
    assert (scan_value["stage"], scan_value["committed"]) == ("scan", str(run_dir / "scan" / "committed.json"))

    # The sensor fired in the triggerer and the report read the committed rows (Q1: 4 groups).
    report_run = dep.wait_runs_finished(REPORT_DAG_ID, [report_run_id], 180)[report_run_id]
    assert report_run["state"] == "success", f"{REPORT_DAG_ID} run {report_run_id} is {report_run['state']}"
    xcom = dep.api("GET", f"/dags/{REPORT_DAG_ID}/dagRuns/{quote(report_run_id, safe='')}/taskInstances/report/"
                          "xcomEntries/return_value?deserialize=true")
    value = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert value == {"run_id": run_id, "rows": 4, "path": str(output)}

    # The sink's commit is an asset event describing it.
    events = dep.api("GET", f"/assets/events?source_dag_id={DAG_ID}&source_run_id={quote(run_id, safe='')}")
    sink_events = [e for e in events["asset_events"] if e["source_task_id"] == "aggregate"]
    assert len(sink_events) == 1, events
    extra = sink_events[0]["extra"]
    assert sink_events[0]["uri"] == (tmp_path / "output" / DAG_ID).as_uri()
    assert (extra["run_id"], extra["logical_date"], extra["records"], extra["location"]) == (
        run_id, LOGICAL_DATE, 4, str(output))
    assert extra["attempts_admitted"] == {"0": 0, "1": 0} and extra["numEffectiveSpeculativeExecutions"] == 0


def run_q3_and_check_boundaries(dep: AirflowCluster, tpch: Path, tmp_path: Path) -> None:
    """The six-stage Q3 example: equal to DuckDB; every consumer waited in the triggerer and launched only after
    each of its producers committed. The boundary gaps are printed (timing claims live in bench/)."""
    dep.wait_dag(Q3_DAG_ID)
    # From here on the sink's asset event is recorded through the api-server ([speculative]
    # asset_events_conn_id's default connection, defined now in the metadata DB; tpch_q1 above had none and
    # resumed on a worker). The triggerer reads it when the stage is planned: no restart.
    dep.cli("connections", "add", "speculative_api", "--conn-type", "http", "--conn-host", dep.base_url,
            "--conn-login", "publisher", "--conn-password", "not-checked-with-all-admins")
    dep.unpause(Q3_DAG_ID)
    run_id = dep.trigger(Q3_DAG_ID, LOGICAL_DATE)
    final = dep.wait_runs_finished(Q3_DAG_ID, [run_id], 900)[run_id]
    assert final["state"] == "success", f"{Q3_DAG_ID} run {run_id} is {final['state']}"
    problem = q3_difference(read_q3_output(tmp_path / "output" / Q3_DAG_ID / DS), duckdb_q3(tpch))
    assert problem is None, problem

    run_dir = next(p for p in (dep.store / Q3_DAG_ID).iterdir() if p.is_dir())

    def journal(stage: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (run_dir / stage / "journal.jsonl").read_text().splitlines() if line]

    producers = {"join_orders": ["scan_customer", "scan_orders"], "join_lineitem": ["join_orders", "scan_lineitem"],
                 "top": ["join_lineitem"]}
    committed = {stage: json.loads((run_dir / stage / "committed.json").read_text())
                 for stage in ("scan_customer", "scan_orders", "scan_lineitem", "join_orders", "join_lineitem", "top")}
    assert all(record["clear_number"] == 0 for record in committed.values())
    gaps = {}
    for consumer, upstream in producers.items():
        events = journal(consumer)
        names = [e["event"] for e in events]
        assert "inputs_committed" in names, f"{consumer} did not wait in the triggerer: {names[:6]}"
        first_launch = min(e["at"] for e in events if e["event"] == "launch")
        last_commit = max(committed[p]["committed_at"] for p in upstream)
        assert first_launch >= last_commit, f"{consumer} launched before its producers committed"
        gaps[consumer] = round(first_launch - last_commit, 2)
        assert [e.get("by") for e in events if e["event"] == "finalize_done"] == ["triggerer"]
    print(f"\n{Q3_DAG_ID}: producer commit -> consumer first launch (s): {gaps}")

    # The sink stage ended in the triggerer: its asset event came through the REST API, once, keyed by the try.
    top_events = [json.loads(line) for line in (run_dir / "top" / "journal.jsonl").read_text().splitlines()
                  if line]
    recorded = [e for e in top_events if e["event"] == "asset_event_recorded"]
    sink_uri = (tmp_path / "output" / Q3_DAG_ID).as_uri()
    assert [(e["uri"], e["found_earlier"]) for e in recorded] == [(sink_uri, False)], recorded
    events = [e for e in dep.api("GET", "/assets/events?limit=100")["asset_events"] if e["uri"] == sink_uri]
    assert len(events) == 1, events
    extra = events[0]["extra"]
    assert events[0]["id"] == recorded[0]["event_id"] and events[0]["source_task_id"] is None
    assert extra["from_rest_api"] is True and extra["speculative_commit"] == f"{Q3_DAG_ID}/{run_id}/top/try-1"
    assert (extra["run_id"], extra["stage"], extra["records"]) == (run_id, "top", 10), extra
    top = dep.task_instances(Q3_DAG_ID, run_id)["top"]
    assert top["state"] == "success", top
    assert not top.get("hostname"), f"a worker ran the sink task to record its asset event: {top}"
    print(f"{Q3_DAG_ID}: top committed -> run end {_seconds_between(committed['top']['committed_at'], final)}s; "
          f"top task: hostname {top.get('hostname')!r}, try {top.get('try_number')}")


def _seconds_between(epoch: float, run: dict[str, Any]) -> float | None:
    """Seconds from ``epoch`` to the run's end date (None if the API gave none)."""
    from datetime import datetime

    end = run.get("end_date")
    return round(datetime.fromisoformat(end).timestamp() - epoch, 2) if end else None


def check_no_leftovers(dep: AirflowCluster, tmp_path: Path) -> None:
    """Shut everything down: no spark-submit or SparkSubmit driver of this store may be left behind."""
    store = Path(dep.env["AIRFLOW__SPECULATIVE__STORE_PATH"])
    dep.stop()
    wait_until(lambda: not processes_mentioning(str(store)), 15, "every attempt process to have exited",
               interval=0.5, on_timeout=lambda: describe(processes_mentioning(str(store))))
    spark = [p for p in processes_mentioning(str(tmp_path)) if is_spark(p)]
    assert not spark, f"Spark processes left behind:\n{describe(spark)}"
