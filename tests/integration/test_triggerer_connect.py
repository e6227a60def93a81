"""A real triggerer on the shared Connect pool: OpenLineage from whichever process ends a stage, and kills.

OpenLineage over HTTP into a local receiver: one START and one terminal event per stage task try, whichever
process ends it, naming what each stage read and wrote, and every parent run id injected into the attempts
is a run that reports.

Two runs of a two-stage Q1 (scan -> aggregate with a Parquet sink), each stage task reported by exactly one
of two reporters: Airflow's OpenLineage listener (worker runs; its events carry the ``airflow`` run facet)
and the provider (control/lineage_events.py; tries that end in the triggerer, no ``airflow`` facet).

* Worker path, ``airflow dags test``: every task runs and resumes on the (in-process) worker; the provider
  sends nothing. Airflow's listener sends a START per worker run (the deferring run and the resumed one
  share the try's run id) and one COMPLETE.
* Triggerer path, a real scheduler and triggerer (tests/integration/airflow_cluster.py): ``scan`` starts and
  ends in the triggerer, so its START and COMPLETE come from the provider; ``aggregate`` starts in the
  triggerer and resumes on a worker to publish its asset event (no ``speculative_api`` connection), so the
  listener sends its START and COMPLETE and the provider nothing. Exactly one START and one COMPLETE each.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_speculative.devtools.faults import fault_env
from airflow_provider_speculative.devtools.localcluster import connection_definitions
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import DATA, TEST_ENV
from tests.integration.airflow_cluster import LINEITEM, REPO, AirflowCluster, PostgresDatabase, wait_until
from tests.integration.connect_runner import ConnectPool
from tests.integration.spark_helpers import group_processes

pytestmark = [pytest.mark.timeout(900)]

NAMESPACE = "speculative-receiver"
# connect_cancel's attempts wait at the barrier (never released): a kill is what ends them.
HELD = {"connect_cancel/*": {"barrier": True}, "connect_timeout/*": {"barrier": True}}
PARENT = re.compile(r"\(OpenLineage parent run ([0-9a-f-]{36})\)")


class Receiver:
    """An OpenLineage HTTP backend on 127.0.0.1: every POSTed JSON document, in arrival order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def env(self) -> dict[str, str]:
        """The ``[openlineage]`` options sending to this receiver, with the parent injected into every attempt."""
        return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "http", "url": self.url}),
                "AIRFLOW__OPENLINEAGE__NAMESPACE": NAMESPACE,
                "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "true"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    rec.thread.start()
    try:
        yield rec
    finally:
        rec.server.shutdown()
        rec.server.server_close()


def task_events(events: list[dict[str, Any]], dag_id: str) -> dict[str, list[dict[str, Any]]]:
    """The events of each task job ``<dag_id>.<task>`` of the receiver's namespace, by task."""
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        job = event.get("job") or {}
        if job.get("namespace") == NAMESPACE and str(job.get("name", "")).startswith(f"{dag_id}."):
            out.setdefault(job["name"][len(dag_id) + 1:], []).append(event)
    return out


def by_reporter(events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(types sent by Airflow's listener, types sent by the provider): only the listener adds the airflow facet."""
    listener = [e["eventType"] for e in events if "airflow" in (e["run"].get("facets") or {})]
    provider = [e["eventType"] for e in events if "airflow" not in (e["run"].get("facets") or {})]
    return listener, provider


def attempt_parents(run_dir: Path, stage: str) -> set[str]:
    """The OpenLineage parent run id each attempt of ``stage`` was given (its log names it)."""
    logs = sorted(run_dir.glob(f"{stage}/subtask=*/attempt=*/spark-submit.log"))
    assert logs, f"no attempt log of {stage} under {run_dir}"
    parents = set()
    for log in logs:
        found = PARENT.findall(log.read_text(errors="replace"))
        assert found, f"{log} names no OpenLineage parent run"
        parents.update(found)
    return parents


def completed(receiver: Receiver, dag_id: str, tasks: tuple[str, ...], *, dag_run: bool = True,
              timeout: float = 60) -> list[dict[str, Any]]:
    """The receiver's events once every task (and with ``dag_run`` the DAG run) has its terminal event.

    Polled with a deadline: a listener may send an event after the state it reports is recorded.
    """
    def ready() -> list[dict[str, Any]] | None:
        events = receiver.snapshot()
        by_task = task_events(events, dag_id)
        done = all(any(e["eventType"] in ("COMPLETE", "FAIL") for e in by_task.get(t, [])) for t in tasks)
        dag_done = any((e.get("job") or {}).get("name") == dag_id and e["eventType"] in ("COMPLETE", "FAIL")
                       for e in events)
        return events if done and (dag_done or not dag_run) else None

    return list(wait_until(ready, timeout, f"the terminal OpenLineage events of {dag_id} and its tasks {tasks}"))


def check_reported_once(tasks: dict[str, list[dict[str, Any]]], task: str, starts: int | None = 1) -> str:
    """One COMPLETE (no FAIL) and ``starts`` START events (None: at least one), all of one run id; that id."""
    events = tasks.get(task, [])
    types = [e["eventType"] for e in events]
    assert types.count("COMPLETE") == 1 and "FAIL" not in types, f"{task}: {types}"
    assert types.count("START") == starts if starts is not None else types.count("START") >= 1, f"{task}: {types}"
    run_ids = {e["run"]["runId"] for e in events}
    assert len(run_ids) == 1, f"{task}: events of several runs {run_ids}"
    return run_ids.pop()


def test_worker_path_airflows_listener_reports_every_stage_and_the_provider_nothing(
        airflow_db: Path, tpch_data: Path, receiver: Receiver) -> None:
    env = {**os.environ, **TEST_ENV, **receiver.env()}
    airflow = str(Path(sys.executable).parent / "airflow")
    result = subprocess.run([airflow, "dags", "test", "small_q1", "2026-02-12"], env=env, capture_output=True,
                            text=True, timeout=800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The command's process is the one whose exit skips the shutdown collection (processexit.py), once.
    assert (result.stdout + result.stderr).count("skips the interpreter's shutdown collection") == 1
    tasks = task_events(completed(receiver, "small_q1", ("scan", "aggregate"), dag_run=False,
                                 timeout=30), "small_q1")

    store = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"]) / "small_q1"
    (run_dir,) = {p.parent.parent for p in store.glob("*/scan/plan.json")
                  if str(json.loads(p.read_text()).get("logical_date", "")).startswith("2026-02-12")}
    for task in ("scan", "aggregate"):
        assert by_reporter(tasks[task])[1] == [], f"{task}: the provider reported a try the listener reports"
        # The listener sends a START per worker run: dag.test() runs the trigger in line and resumes the task
        # on the worker (and may reschedule a consumer picked before its producer), all under one run id.
        run_id = check_reported_once(tasks, task, starts=None)
        assert attempt_parents(run_dir, task) == {run_id}, f"{task}: an attempt's parent never reported"
    # Each COMPLETE names what the stage read and wrote: the scan its source and its exchange, the aggregate
    # the exchange, the source it came from (the sink's event carries the lineage end to end) and the sink's
    # dataset, the one its Airflow asset names.
    def names(event: dict[str, Any], side: str) -> set[tuple[str, str]]:
        return {(d["namespace"], d["name"]) for d in event[side]}

    source, exchange = ("file", str(DATA)), ("speculative", "small_q1/scan")
    (complete,) = [e for e in tasks["scan"] if e["eventType"] == "COMPLETE"]
    assert names(complete, "inputs") == {source} and names(complete, "outputs") == {exchange}
    (complete,) = [e for e in tasks["aggregate"] if e["eventType"] == "COMPLETE"]
    assert names(complete, "inputs") == {source, exchange}
    assert names(complete, "outputs") == {("file", str(Path(TEST_ENV["SPECULATIVE_EXAMPLE_OUTPUT"]) / "small_q1"))}
    (output,) = complete["outputs"]
    assert output["outputFacets"]["outputStatistics"]["rowCount"] == 4  # Q1: four groups, from the manifests
    assert {f["name"] for f in output["facets"]["schema"]["fields"]} >= {"l_returnflag", "l_linestatus"}


@pytest.fixture(scope="module")
def postgres_db() -> Iterator[PostgresDatabase]:
    db = PostgresDatabase()
    db.create_migrated()
    yield db
    db.drop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, postgres_db: PostgresDatabase,
               shared_connect_pool: ConnectPool, receiver: Receiver) -> Iterator[AirflowCluster]:
    """api-server, scheduler, dag-processor and triggerer sending OpenLineage to the receiver.

    It serves connect_q1.py's two DAGs: connect_q1, and connect_cancel, whose attempts are held at the
    fault-injection barrier (CONTRIBUTING.md, "Injecting faults") so that a kill finds them running.
    """
    if not sorted(LINEITEM.glob("lineitem.*.parquet")):
        pytest.skip(f"TPC-H lineitem data missing at {LINEITEM}: run `make data` first")
    tmp_path = tmp_path_factory.mktemp("triggerer-connect")
    dags = tmp_path / "dags"
    dags.mkdir()
    # connect_q1's stages run on the session's warm Connect servers, under the connection ids the DAG names.
    (dags / "connect_q1.py").symlink_to(REPO / "tests" / "integration" / "dags" / "connect_q1.py")
    connections = {name.replace("LOCAL", "TEST"): value
                   for name, value in connection_definitions(list(shared_connect_pool.servers)).items()}
    dep = AirflowCluster(tmp_path, postgres_db.url, dags_folder=dags, data=LINEITEM,
                         extra_env={"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True", **connections,
                                    **receiver.env(), **fault_env(HELD)})
    try:
        dep.start_all()
        dep.wait_healthy()
        yield dep
    finally:
        dep.shutdown()


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_triggerer_path_each_stage_task_reported_once_by_whoever_ends_it(
        deployment: AirflowCluster, receiver: Receiver) -> None:
    dag_id = "connect_q1"
    try:
        deployment.wait_dag(dag_id)
        deployment.unpause(dag_id)
        run_id = deployment.trigger(dag_id, "2026-01-01T00:00:00+00:00")
        final = deployment.wait_runs_finished(dag_id, [run_id], 600)[run_id]
        assert final["state"] == "success", f"run {run_id} is {final['state']}"
        events = completed(receiver, dag_id, ("scan", "aggregate"))
    except BaseException:
        print(f"\n{deployment.diagnostics()}")
        raise
    tasks = task_events(events, dag_id)
    dag_complete = [e for e in events if (e.get("job") or {}).get("name") == dag_id and e["eventType"] == "COMPLETE"]
    run_dir = next(p for p in (deployment.store / dag_id).iterdir() if p.is_dir())

    # scan started and ended in the triggerer: the provider sent both events, the listener none.
    scan = check_reported_once(tasks, "scan")
    assert by_reporter(tasks["scan"]) == ([], ["START", "COMPLETE"]), by_reporter(tasks["scan"])
    # aggregate resumed on a worker to publish its asset event: the listener sent both, the provider none.
    aggregate = check_reported_once(tasks, "aggregate")
    assert by_reporter(tasks["aggregate"]) == (["START", "COMPLETE"], []), by_reporter(tasks["aggregate"])

    # Every attempt's parent is its task try's reported run; every task's parent is the reported DAG run.
    assert attempt_parents(run_dir, "scan") == {scan}
    assert attempt_parents(run_dir, "aggregate") == {aggregate}
    dag_run_ids = {e["run"]["runId"] for e in dag_complete}
    for task in ("scan", "aggregate"):
        parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in tasks[task]}
        assert parents <= dag_run_ids, f"{task}: parent {parents} is not the reported DAG run {dag_run_ids}"

    # The provider's COMPLETE of scan carries the datasets and the committed output's facets.
    (complete,) = [e for e in tasks["scan"] if e["eventType"] == "COMPLETE"]
    assert {(d["namespace"], d["name"]) for d in complete["inputs"]} == {("file", str(LINEITEM))}
    (output,) = complete["outputs"]
    assert (output["namespace"], output["name"]) == ("speculative", f"{dag_id}/scan")
    stats = output["outputFacets"]["outputStatistics"]
    committed = json.loads((run_dir / "scan" / "committed.json").read_text())
    assert stats["size"] == sum(s["bytes"] for s in committed["subtasks"].values())
    assert stats["rowCount"] == sum(s["records"] for s in committed["subtasks"].values())


def _run_dir(dep: AirflowCluster, dag_id: str, ds: str) -> Path:
    """The store directory of the DAG run of ``dag_id`` whose plans name logical date ``ds``."""
    for plan in (dep.store / dag_id).glob("*/*/plan.json"):
        if str(json.loads(plan.read_text()).get("logical_date", "")).startswith(ds):
            return plan.parent.parent
    return dep.store / dag_id / "no-such-run"


def _server_jobs(pool: ConnectPool, session: dict[str, Any], status: str = "") -> list[dict[str, Any]]:
    """The Spark jobs of an attempt's Connect session on its server (its REST API), by status if given."""
    port = int(session["server"].split(";")[0].rstrip("/").rsplit(":", 1)[1])
    (server,) = [s for s in pool.servers if s.port == port]
    base = f"http://127.0.0.1:{server.ui_port}/api/v1/applications"
    with urllib.request.urlopen(base, timeout=5) as resp:
        app = json.load(resp)[0]["id"]
    with urllib.request.urlopen(f"{base}/{app}/jobs" + (f"?status={status}" if status else ""), timeout=5) as resp:
        jobs = json.load(resp)
    prefix = f"SparkConnect_OperationTag_User_{session['user_id']}_Session_{session['session_id']}_"
    return [j for j in jobs if any(t.startswith(prefix) for t in j.get("jobTags", []))]


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(900)
def _writing_on_the_server(dep: AirflowCluster, pool: ConnectPool, dag_id: str, ds: str
                           ) -> tuple[str, StageLayout, dict[str, Any]]:
    """Trigger ``dag_id`` for ``ds`` and wait until attempt 0's write job runs on its server."""
    dep.wait_dag(dag_id)
    dep.unpause(dag_id)
    run_id = dep.trigger(dag_id, f"{ds}T00:00:00+00:00")

    def writing() -> StageLayout | None:
        plan = _run_dir(dep, dag_id, ds) / "count" / "plan.json"
        layout = StageLayout.of_plan(json.loads(plan.read_text())) if plan.exists() else None
        return layout if layout is not None and layout.data(0, 0).exists() else None

    # Attempt 0's write job runs on the server (its UDF sleeps for minutes): a kill must stop it there.
    layout = wait_until(writing, 300, "attempt 0 of count to start writing", interval=0.5)
    session = json.loads(layout.connect(0, 0).read_text())
    wait_until(lambda: _server_jobs(pool, session, "running"), 120, "attempt 0's job to run on its server",
               interval=0.5)
    return run_id, layout, session


def _killed_all(layout: StageLayout, since: float, reason: str, timeout: float) -> dict[str, Any]:
    """The stage's first ``killed_all`` journal event with ``reason`` at or after ``since`` (polled)."""
    def killed() -> list[dict[str, Any]]:
        lines = layout.journal.read_text().splitlines() if layout.journal.exists() else []
        return [e for e in map(json.loads, lines)
                if e["event"] == "killed_all" and e["at"] >= since and e["reason"] == reason]

    (event, *_) = wait_until(killed, timeout, f"the trigger to journal killed_all ({reason})", interval=0.5)
    return event


def _nothing_left(pool: ConnectPool, layout: StageLayout, session: dict[str, Any]) -> None:
    """Every attempt's Connect session was released with the connection's URL, and nothing of it runs."""
    for attempt in layout.attempt_numbers(0):
        record = json.loads(layout.connect(0, attempt).read_text())
        cancel = json.loads((layout.attempt_dir(0, attempt) / "connect-cancel.json").read_text())
        assert cancel.get("released_at") and not cancel.get("error"), cancel
        wait_until(lambda r=record: not _server_jobs(pool, r, "running"), 60,
                   f"no job of attempt {attempt}'s session running on the server", interval=0.5)
        assert group_processes(json.loads(layout.status(0, attempt).read_text())["pgid"]) == []
    assert _server_jobs(pool, session), "attempt 0's session never ran a job"


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("how", "ds"), [("mark_success", "2026-03-01"), ("mark_failed", "2026-03-03"),
                                         ("delete_dag", "2026-03-02")])
def test_marking_success_or_failed_or_deleting_the_dag_stops_its_attempts_on_the_server(
        deployment: AirflowCluster, shared_connect_pool: ConnectPool, how: str, ds: str) -> None:
    dag_id = "connect_cancel"
    try:
        run_id, layout, session = _writing_on_the_server(deployment, shared_connect_pool, dag_id, ds)
        killed_at = time.time()
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
        if how in ("mark_success", "mark_failed"):
            deployment.api("PATCH", f"{path}/taskInstances/count", {"new_state": how.removeprefix("mark_")})
        else:
            # The REST API refuses to delete a running DAG run (409); deleting the DAG's records does not.
            deployment.cli("dags", "delete", "--yes", dag_id)
        # The triggerer cancels the trigger as a user action: on_kill stops every attempt and journals it.
        event = _killed_all(layout, killed_at, "task killed by user", 120)
    except BaseException:
        print(f"\n{deployment.diagnostics()}")
        raise
    assert event["left"] == [], f"on_kill could not stop: {event}"
    # Marked success or failed alike: the trigger cannot tell which, so the task state claims neither.
    state = json.loads(layout.task_state.read_text())
    assert state["state"] == "killed", state
    _nothing_left(shared_connect_pool, layout, session)


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_an_execution_timeout_in_the_triggerer_stops_its_attempts_on_the_server(
        deployment: AirflowCluster, shared_connect_pool: ConnectPool) -> None:
    # connect_timeout's stage has a 40 s execution_timeout: Airflow gives the trigger that deadline, and
    # whoever notices first (the trigger's loop, or the scheduler cancelling the trigger) stops the attempts.
    dag_id, ds = "connect_timeout", "2026-03-04"
    try:
        started = time.time()
        run_id, layout, session = _writing_on_the_server(deployment, shared_connect_pool, dag_id, ds)
        event = _killed_all(layout, started, "execution_timeout", 180)
        final = deployment.wait_runs_finished(dag_id, [run_id], 300)[run_id]
        tis = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")
    except BaseException:
        print(f"\n{deployment.diagnostics()}")
        raise
    assert event["left"] == [], f"the timeout could not stop: {event}"
    assert final["state"] == "failed", final
    (ti,) = [t for t in tis["task_instances"] if t["task_id"] == "count"]
    assert ti["state"] == "failed", ti
    state = json.loads(layout.task_state.read_text())
    assert state["state"] == "failed" and "execution_timeout passed" in state["reason"], state
    _nothing_left(shared_connect_pool, layout, session)
