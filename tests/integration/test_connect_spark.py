"""Spark Connect targets end to end: real Connect servers (the local-cluster module), real Airflow dag.test().

(a) the example's Q1 pipeline commits the same rows on Connect targets as on spark-submit targets;
(b) a losing attempt whose query runs on the server is really stopped there (checked through the
server's own REST API), its client is gone and its output removed; (c) the status read model gives
every attempt its application id and start-up time on both kinds of target; (d) the join example
(TPC-H Q3, six stages, two joins over all_to_all exchanges) commits exactly DuckDB's answer, and
`airflow speculative whatif` replays the run with its own settings within 15% of its makespan (or 1 s:
the run lasts about 5 s, and one stage boundary's scheduling jitter is most of 15% of that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pendulum
import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.devtools.localcluster import application_id
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import COMMITTED_LIST
from tests.conftest import TEST_ENV
from tests.integration.dag_faults import CONNECT_CANCEL
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.q3 import duckdb_q3, q3_difference, read_q3_output
from tests.integration.spark_helpers import HERE, group_processes, load_dag, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
OUTPUT = Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"])
REPO_APPS = HERE.parents[1] / "dags" / "apps"


def _rest(ui_port: int, path: str) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/applications{path}", timeout=5) as resp:
        return json.loads(resp.read().decode())


def _attempts(report: dict) -> list[dict]:
    return [a for stage in report["stages"] for sub in stage["subtasks"] for a in sub["attempts"]]


def test_q1_on_connect_equals_spark_submit(airflow_db, tpch_data, connect_pool):
    date = pendulum.datetime(2026, 5, 1, tz="UTC")
    dags = HERE / "dags"
    connect_run = load_dag("connect_q1", dags).test(logical_date=date)
    assert connect_run.state == "success"
    submit_run = load_dag("small_q1", dags).test(logical_date=date)
    assert submit_run.state == "success"

    on_connect = read_q1_output(OUTPUT / "connect_q1" / "2026-05-01")
    on_submit = read_q1_output(OUTPUT / "small_q1" / "2026-05-01")
    assert on_connect == on_submit  # exactly the same rows, not only within a tolerance
    assert_q1_equal(on_connect, duckdb_q1(tpch_data))

    # (c) every attempt has its application id and start-up time, on both kinds of target.
    connect_apps = {application_id(s.ui_port) for s in connect_pool.values()}
    assert None not in connect_apps
    for dag_id, run in (("connect_q1", connect_run), ("small_q1", submit_run)):
        attempts = _attempts(run_report(STORE, dag_id, run.run_id))
        assert attempts
        for attempt in attempts:
            assert attempt["app_id"], (dag_id, attempt)
            assert attempt["startup_seconds"] is not None and attempt["startup_seconds"] > 0, (dag_id, attempt)
            # On Connect the application is the server's; on spark-submit each attempt is its own.
            assert (attempt["app_id"] in connect_apps) == (dag_id == "connect_q1"), (dag_id, attempt)
    # Where each admitted attempt's time went adds up to its claim-to-end time, and agrees with the journal:
    # the controller launched it before it started, admitted it after it ended.
    for dag_id, run in (("connect_q1", connect_run), ("small_q1", submit_run)):
        report = run_report(STORE, dag_id, run.run_id)
        for stage in report["stages"]:
            events = read_jsonl(StageLayout(STORE, dag_id, run.run_id, stage["stage"]).journal)
            assert stage["breakdown_line"] and stage["breakdown"]["spark"] > 0, stage["stage"]
            for sub in stage["subtasks"]:
                a = next(a for a in sub["attempts"] if a["admitted"])
                phases = a["phases"]
                assert all(phases[k] is not None and phases[k] >= 0 for k in ("queue", "start", "app", "spark",
                                                                              "commit", "exit")), phases
                claimed = read_json(StageLayout(STORE, dag_id, run.run_id, stage["stage"]).claim(
                    sub["subtask"], a["attempt"]))["created_at"]
                total = sum(phases[k] for k in ("queue", "start", "app", "spark", "commit", "exit"))
                assert abs(total - (a["end"] - claimed)) < 0.05, (phases, a)
                launched = next(e["at"] for e in events if e["event"] == "launch"
                                and (e["subtask"], e["attempt"]) == (sub["subtask"], a["attempt"]))
                admitted = next(e["at"] for e in events if e["event"] == "admit"
                                and (e["subtask"], e["attempt"]) == (sub["subtask"], a["attempt"]))
                assert claimed - 0.5 <= launched <= a["start"] + 0.5 and admitted >= a["end"] - 0.5, (a, events)
        # The critical path ends at the last stage and steps back through the stage it read, each stage's
        # span bounded by its journal's first launch and its last admission.
        path = report["critical_path"]
        assert [e["stage"] for e in path] == [s["stage"] for s in report["stages"]], path  # scan -> aggregate
        for entry in path:
            events = read_jsonl(StageLayout(STORE, dag_id, run.run_id, entry["stage"]).journal)
            first_launch = min(e["at"] for e in events if e["event"] == "launch")
            last_admit = max(e["at"] for e in events if e["event"] == "admit")
            assert first_launch - 0.5 <= entry["start"] and entry["end"] <= last_admit + 0.5, (entry, dag_id)
        assert path[1]["gap"] >= 0 and report["critical_path_line"].startswith("critical path (s): "), path
    # The CLI prints the same read model.
    import subprocess
    import sys

    out = subprocess.run([str(Path(sys.executable).parent / "airflow"), "speculative", "status", "--dag-id",
                          "connect_q1", "--run-id", connect_run.run_id, "--output", "json"],
                         check=True, capture_output=True, text=True, env={**os.environ, **TEST_ENV}).stdout
    cli_attempts = _attempts(json.loads(out[out.index("{"):]))
    assert [a["app_id"] for a in cli_attempts] == [a["app_id"] for a in _attempts(
        run_report(STORE, "connect_q1", connect_run.run_id))]
    assert all(a["startup_seconds"] for a in cli_attempts)
    assert [e["stage"] for e in json.loads(out[out.index("{"):])["critical_path"]] == ["scan", "aggregate"]
    # Both kinds of session write through the raw local filesystem (runtime/session.py SESSION_DEFAULTS):
    # no Hadoop .crc beside any file of either run's exchange and sink outputs.
    for dag_id, run in (("connect_q1", connect_run), ("small_q1", submit_run)):
        for root in (StageLayout(STORE, dag_id, run.run_id, "scan").run_dir, OUTPUT / dag_id):
            assert list(root.rglob("*.parquet")) and not list(root.rglob("*.crc")), (dag_id, root)
        # Both kinds of attempt write the exchange through the provider's commit protocol: the pool's servers
        # and each spark-submit attempt have its jar ([speculative] exchange_commit = auto).
        scan = StageLayout(STORE, dag_id, run.run_id, "scan")
        for subtask, part in read_json(scan.committed)["subtasks"].items():
            data = scan.data(int(subtask), part["attempt"])
            assert (data / COMMITTED_LIST).exists() and not (data / "_SUCCESS").exists(), (dag_id, subtask)


def test_losing_attempt_is_stopped_on_the_server(airflow_db, tpch_data, connect_pool):
    with injected(CONNECT_CANCEL):  # a copy at once: the original is the loser
        run = load_dag("connect_cancel", HERE / "dags").test(logical_date=pendulum.datetime(2026, 5, 2, tz="UTC"))
    assert run.state == "success"
    layout = StageLayout(STORE, "connect_cancel", run.run_id, "count")
    report = run_report(STORE, "connect_cancel", run.run_id)
    loser, winner = report["stages"][0]["subtasks"][0]["attempts"][:2]
    assert (loser["attempt"], loser["state"], loser["admitted"]) == (0, "CANCELED", False)
    assert (winner["attempt"], winner["state"], winner["admitted"]) == (1, "FINISHED", True)

    session = read_json(layout.attempt_dir(0, 0) / "connect.json")
    cancel = read_json(layout.attempt_dir(0, 0) / "connect-cancel.json")
    # The loser's query was running on the server when it was cancelled, and the session is closed.
    assert cancel["session_id"] == session["session_id"] and cancel["interrupted"], cancel
    assert cancel.get("released_at") and not cancel.get("error"), cancel

    server = connect_pool[session["server"].split(";")[0]]
    app = _rest(server.ui_port, "")[0]["id"]
    prefix = f"SparkConnect_OperationTag_User_{session['user_id']}_Session_{session['session_id']}_"

    def jobs(status: str = "") -> list[dict]:
        found = _rest(server.ui_port, f"/{app}/jobs" + (f"?status={status}" if status else ""))
        return [j for j in found if any(t.startswith(prefix) for t in j.get("jobTags", []))]

    assert jobs(), "the server never ran a job of the losing attempt's session"
    wait_for(lambda: not jobs("running"), 60, "no job of the cancelled attempt running on the server")
    assert any(j["status"] == "FAILED" for j in jobs()), jobs()  # the interrupted write job

    # Its client is gone and the controller removed its output.
    assert group_processes(read_json(layout.status(0, 0))["pgid"]) == []
    assert not layout.data(0, 0).exists() and not layout.manifest(0, 0).exists()
    assert layout.manifest(0, 1).exists()


@pytest.fixture(scope="module")
def tiny_tpch(tmp_path_factory) -> Path:
    """customer, orders and lineitem at scale factor 0.01 (2 Parquet parts each), from tpchgen-cli."""
    root = tmp_path_factory.mktemp("tpch-sf0.01")
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", "0.01", "--tables",
                    "customer,orders,lineitem", "--parts", "2", "--output-dir", str(root)],
                   check=True, capture_output=True)
    return root


def test_q3_join_pipeline_on_connect(airflow_db, tiny_tpch, connect_pool, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECULATIVE_TEST_TPCH", str(tiny_tpch))  # read when the DAG folder is parsed
    run = load_dag("connect_q3", HERE / "dags").test(logical_date=pendulum.datetime(2026, 5, 3, tz="UTC"))
    assert run.state == "success"

    got = read_q3_output(OUTPUT / "connect_q3" / "2026-05-03")
    want = duckdb_q3(tiny_tpch)
    assert len(want) == 10
    assert q3_difference(got, want) is None, q3_difference(got, want)  # exact decimals, dates and keys

    # Both sides of each join read the same subpartition ranges (a key meets its partners in one subtask).
    for stage, sides in (("join_orders", ("customer", "orders")), ("join_lineitem", ("orders", "lineitem"))):
        plan = read_json(StageLayout(STORE, "connect_q3", run.run_id, stage).plan)
        for subtask in plan["subtasks"]:
            left, right = (subtask["inputs"][side]["subpartitions"] for side in sides)
            assert left == right, (stage, subtask["inputs"])

    # Each exchange manifest carries the schema read back from the written files' footers (no extra
    # analysis round trip before the write): it must name exactly the columns in the files.
    import pyarrow.parquet as pq

    for stage in ("scan_customer", "scan_orders", "scan_lineitem", "join_orders", "join_lineitem"):
        layout = StageLayout(STORE, "connect_q3", run.run_id, stage)
        for subtask, part in read_json(layout.committed)["subtasks"].items():
            manifest = read_json(layout.manifest(int(subtask), part["attempt"]))
            names = [f["name"] for f in manifest["schema"]["fields"]]
            for entry in manifest["files"]:
                # A packed file (the default layout) also holds each row's subpartition, which readers drop.
                packed = ["_sp"] if "subpartitions" in entry else []
                assert pq.read_schema(layout.data(int(subtask), part["attempt"]) / entry["path"]).names \
                    == names + packed
            # The pool's servers have the provider's commit protocol: files written in place, no _temporary/,
            # and the manifest names exactly the committed-file list.
            data = layout.data(int(subtask), part["attempt"])
            listed = (data / COMMITTED_LIST).read_text().split()
            assert sorted(entry["path"] for entry in manifest["files"]) == sorted(listed), (stage, subtask)
            assert not (data / "_temporary").exists() and not (data / "_SUCCESS").exists()


    # What-if replay of this real run with its own settings predicts its makespan within 15%, or 1 s
    # (devtools/simulator.py: the real scheduler core on the run's measured attempt times; the replay
    # does not model Airflow's hand-over between tasks, whose jitter alone nears 15% of a 5 s run).
    from airflow_provider_speculative.devtools.simulator import whatif

    replay = whatif(STORE, "connect_q3", run.run_id, {})
    recorded, replayed = replay["recorded"]["makespan"], replay["replayed"]["makespan"]
    assert recorded > 0 and abs(replayed - recorded) <= max(0.15 * recorded, 1.0), replay
    assert replay["replayed"]["copies"] == replay["recorded"]["copies"] == 0, replay

    _an_output_without_its_exchange_key_fails_naming_the_columns(run.run_id, connect_pool, tmp_path)
    _an_output_with_a_column_named_sp_is_refused_before_writing(run.run_id, connect_pool, tmp_path)


def _run_scan_customer(run_id: str, new_run_id: str, app: Path, output: dict, connect_pool: dict,
                       tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict, StageLayout]:
    """One attempt of ``app`` on scan_customer's plan of ``run_id`` as run ``new_run_id``; its failure record."""
    plan = read_json(StageLayout(STORE, "connect_q3", run_id, "scan_customer").plan)
    plan.update(run_id=new_run_id, output={**plan["output"], **output})
    plan_path = tmp_path / f"{new_run_id}.json"
    plan_path.write_text(json.dumps(plan))
    url = next(iter(connect_pool))
    session = str(uuid.uuid4())
    env = {**os.environ, "SPECULATIVE_SPARK_REMOTE": f"{url};user_id=test;session_id={session}"}
    result = subprocess.run([sys.executable, str(app), "--plan", str(plan_path),
                             "--subtask", "0", "--attempt", "0", "--target", "connect-a"],
                            env=env, capture_output=True, text=True, timeout=300)
    layout = StageLayout(STORE, "connect_q3", new_run_id, "scan_customer")
    return result, read_json(layout.attempt_dir(0, 0) / "failure.json"), layout


def _an_output_without_its_exchange_key_fails_naming_the_columns(run_id: str, connect_pool: dict, tmp_path: Path):
    """The key check runs only when the write fails (no schema round trip first), and still names the columns."""
    result, failure, layout = _run_scan_customer(run_id, "missing-key", REPO_APPS / "q3_scan_customer.py",
                                                 {"key": ["no_such_column"]}, connect_pool, tmp_path)
    assert result.returncode != 0
    assert "lacks exchange key columns ['no_such_column']" in failure["error"]
    assert "c_custkey" in failure["error"]  # the columns it has
    assert not layout.manifest(0, 0).exists()


def _an_output_with_a_column_named_sp_is_refused_before_writing(run_id: str, connect_pool: dict, tmp_path: Path):
    """A column the exchange would overwrite with each row's subpartition is refused, in any case, unwritten."""
    app = tmp_path / "sp_column.py"
    app.write_text("from pyspark.sql import functions as F\n"
                   "from airflow_provider_speculative.runtime import StageContext\n"
                   "with StageContext.from_argv() as ctx:\n"
                   "    ctx.write(ctx.read('customer').select('c_custkey', F.lit(7).alias('_SP')))\n")
    result, failure, layout = _run_scan_customer(run_id, "sp-column", app, {}, connect_pool, tmp_path)
    assert result.returncode != 0
    assert "pipeline 'connect_q3', stage 'scan_customer'" in failure["error"], failure["error"]
    assert "has a column named '_SP'" in failure["error"] and "c_custkey" in failure["error"]
    assert not layout.manifest(0, 0).exists()
    assert not layout.data(0, 0).exists() or not any(p.is_file() for p in layout.data(0, 0).rglob("*"))
