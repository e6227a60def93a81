"""Backfills and crash safety through a real Airflow deployment (issue #5, items 4 and 6).

One deployment (PostgreSQL + LocalExecutor, api-server, scheduler, dag-processor, triggerer) is shared by
the tests of this module; each test uses its own DAG run(s), so that they do not see each other's attempts.
DAGs: ``tests/integration/e2e_dags/e2e_q1.py`` (2 scan subtasks, 1 aggregate subtask, over two lineitem
parts; ``e2e_q1`` on the suite's Spark Connect servers, the others one spark-submit per attempt).
``e2e_q1_barrier`` holds its scan attempts (Spark drivers alive, heartbeat phase ``BARRIER``) until the
test writes the release files, so every crash below happens while attempts are running, for as long as
the test needs, without sleeping: the tests only poll the store and the REST API, with deadlines.

- backfill (the default path: stage tasks start and commit in the triggerer): ``airflow backfill create``
  over 2 dates gives each date exactly one committed output; then the
  source changes and a second backfill with ``--reprocess-behavior completed`` recomputes every stage once and
  replaces each date's output (new directory, new commit, the new Q1, nothing appended or left over).
- kill -9 of the triggerer or of the scheduler (each with every process of its group) while scan attempts run:
  after a restart the run succeeds, with one attempt per subtask and DuckDB's Q1.
- kill -9 of the triggerer after a trigger committed its stage and before its event ended the task: the
  restarted triggerer commits the same attempts again and ends the task (try 1), nothing is relaunched.
- kill -9 of the LocalExecutor task process of a stage task that resumed to finalize: the task is retried,
  reuses the admitted attempts and the run completes.
- marking a deferred stage task failed through the REST API kills every Spark driver of the stage.
- a consumer waits in the triggerer from the run's start: clearing its producer with downstream makes it plan
  on the producer's new commit, never the old one; a producer that fails fails it at once, naming it.
- after shutdown no Spark process of the deployment is left.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import pytest

from airflow_provider_speculative.devtools.faults import fault_env
from airflow_provider_speculative.devtools.localcluster import connection_definitions, targets_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.integration.airflow_cluster import (
    LINEITEM,
    AirflowCluster,
    PostgresDatabase,
    describe,
    is_spark,
    processes_mentioning,
    wait_until,
)
from tests.integration.connect_runner import ConnectPool
from tests.integration.dag_faults import E2E_Q1
from tests.integration.q1 import Q1Result, assert_q1_equal, duckdb_q1, output_decimal_scales, read_q1_output
from tests.processes import group_processes

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

HERE = Path(__file__).resolve().parent
E2E_DAGS = HERE / "e2e_dags"
DAG = "e2e_q1"
WORKER_DAG = "e2e_q1_worker"
BARRIER_DAG = "e2e_q1_barrier"
COMMIT_DAG = "e2e_q1_commit"
PUBLISH_DAG = "e2e_q1_publish"
EAGER_DAG = "e2e_q1_eager"
BROKEN_DAG = "e2e_q1_broken"
STAGES = {"scan": 2, "aggregate": 1}  # stage -> parallelism, as in e2e_dags/e2e_q1.py
PARTS = 2  # lineitem parts the pipeline reads (one per scan subtask)
RUN_TIMEOUT = 1200  # a run on this shared 2-CPU machine takes 1-3 min; be patient
TERMINAL = ("FINISHED", "FAILED", "CANCELED")

DURATIONS: dict[str, float] = {}


@dataclass
class Deployment:
    """The shared cluster plus what the tests compare against."""

    cluster: AirflowCluster
    data: Path
    expected: Q1Result
    control: Path


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, shared_connect_pool: ConnectPool) -> Iterator[Deployment]:
    """A healthy deployment with its test DAGs parsed and unpaused; shut down (and leak-checked) after."""

    parts = sorted(LINEITEM.glob("lineitem.*.parquet"))
    if len(parts) <= PARTS:  # one spare part replaces a used one in the backfill test
        pytest.skip(f"TPC-H lineitem data missing at {LINEITEM}: run `make data` first")
    parts = parts[:PARTS]
    root = tmp_path_factory.mktemp("e2e-recovery")
    data, control = root / "lineitem", root / "control"
    data.mkdir()
    control.mkdir()
    for part in parts:
        shutil.copy(part, data / part.name)
    db = PostgresDatabase()
    db.create_migrated()
    cluster = AirflowCluster(root, db.url, dags_folder=E2E_DAGS, data=data, extra_env={
        # The REST API hands out admin tokens without credentials (mark failed, polling).
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        # LocalExecutor forks `parallelism` workers up front: a few are plenty here.
        "AIRFLOW__CORE__PARALLELISM": "8",
        # A restarted triggerer takes over the triggers of a dead one once its heartbeat is this old (s);
        # a restarted scheduler adopts or resets the queued/running tasks of a dead one likewise.
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
        "SPECULATIVE_E2E_CONTROL": str(control),
        # Every component and attempt of the deployment injects the test DAGs' faults (barrier, hold_commit).
        **fault_env(E2E_Q1),
        # e2e_q1 runs on the suite's warm Connect servers.
        **connection_definitions(list(shared_connect_pool.servers)),
        "SPECULATIVE_E2E_CONNECT_TARGETS": targets_json(list(shared_connect_pool.servers)),
    })
    started = time.monotonic()
    try:
        cluster.start_all()
        cluster.wait_healthy()
        for dag_id in (DAG, WORKER_DAG, BARRIER_DAG, COMMIT_DAG, PUBLISH_DAG, EAGER_DAG, BROKEN_DAG):
            cluster.wait_dag(dag_id)
            cluster.unpause(dag_id)
        DURATIONS["cluster start"] = time.monotonic() - started
        yield Deployment(cluster, data, duckdb_q1(data), control)
    except BaseException:
        print(f"\n{cluster.diagnostics()}")
        raise
    finally:
        cluster.shutdown()
        db.drop()
        print("\ndurations: " + ", ".join(f"{name} {seconds:.0f}s" for name, seconds in DURATIONS.items()))


@contextlib.contextmanager
def diagnosed(dep: Deployment, name: str) -> Iterator[None]:
    """Time a test; on any failure (also pytest-timeout's) print the deployment's diagnostics."""
    started = time.monotonic()
    try:
        yield
    except BaseException:
        print(f"\n{dep.cluster.diagnostics()}")
        raise
    finally:
        DURATIONS[name] = time.monotonic() - started
        print(f"\n{name}: {DURATIONS[name]:.0f}s")


# -- store helpers ------------------------------------------------------------------------------


def layout(dep: Deployment, dag_id: str, run_id: str, stage: str) -> StageLayout:
    """Paths of one stage run in the deployment's store."""
    return StageLayout(dep.cluster.store, dag_id, run_id, stage)


def read(path: Path) -> dict[str, Any] | None:
    """A JSON file, or None if it does not exist (yet)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def journal(stage: StageLayout) -> list[dict[str, Any]]:
    """Every event of a stage's journal."""
    if not stage.journal.exists():
        return []
    return [json.loads(line) for line in stage.journal.read_text().splitlines() if line.strip()]


def events(stage: StageLayout, name: str) -> list[dict[str, Any]]:
    """The journal events called ``name``."""
    return [e for e in journal(stage) if e["event"] == name]


def claims(stage: StageLayout, parallelism: int) -> dict[int, list[int]]:
    """Attempt numbers claimed (``claim.json`` exists) per subtask."""
    return {s: [n for n in stage.attempt_numbers(s) if stage.claim(s, n).exists()] for s in range(parallelism)}


def wait_scan_held(dep: Deployment, dag_id: str, run_id: str) -> dict[int, dict[str, Any]]:
    """Wait until every scan subtask's attempt 0 is alive and waiting at the barrier; return their status.json."""
    scan = layout(dep, dag_id, run_id, "scan")

    def held() -> dict[int, dict[str, Any]] | None:
        dep.cluster.check_alive()
        found = {}
        for subtask in range(STAGES["scan"]):
            status = read(scan.status(subtask, 0)) or {}
            beat = read(scan.heartbeat(subtask, 0)) or {}
            assert status.get("state") not in TERMINAL, f"scan attempt {subtask}/0 ended early: {status}"
            if beat.get("phase") != "BARRIER" or not status.get("pgid"):
                return None
            found[subtask] = status
        return found

    return wait_until(held, RUN_TIMEOUT, f"both scan attempts of {run_id} to run and wait at the barrier",
                      interval=1)


def release_scan(dep: Deployment, dag_id: str, run_id: str) -> None:
    """Let the held scan attempts write their manifests and finish."""
    scan = layout(dep, dag_id, run_id, "scan")
    for subtask in range(STAGES["scan"]):
        (scan.dir / f"barrier.release.{subtask}").write_text("go")


# -- assertions ---------------------------------------------------------------------------------


def assert_one_attempt_per_subtask(dep: Deployment, dag_id: str, run_id: str, since: float = 0.0) -> None:
    """Every subtask of every stage has exactly one attempt (claimed, launched once, FINISHED, admitted, committed).

    The atomic claim proves one launch per attempt number. The journal's ``launch`` lines (from ``since`` on: a
    replanned stage keeps its history) may miss an attempt a killed triggerer launched just before it died, but
    never show one twice; a launch the journal missed is one the restarted controller restored.
    """
    for name, parallelism in STAGES.items():
        stage = layout(dep, dag_id, run_id, name)
        assert claims(stage, parallelism) == {s: [0] for s in range(parallelism)}, \
            f"{run_id} stage {name}: claimed attempts {claims(stage, parallelism)}"
        launches = [(e["subtask"], e["attempt"]) for e in events(stage, "launch") if e["at"] >= since]
        assert len(launches) == len(set(launches)) and set(launches) <= {(s, 0) for s in range(parallelism)}, \
            f"{run_id} stage {name}: launches {launches}"
        if len(launches) < parallelism:
            restored = [e for e in events(stage, "restored") if e["at"] >= since]
            assert restored and restored[-1]["attempts"] >= parallelism - len(launches), \
                f"{run_id} stage {name}: launches {launches} and no restore of the others: {restored}"
        for subtask in range(parallelism):
            status = read(stage.status(subtask, 0)) or {}
            assert status.get("state") == "FINISHED", f"{run_id} {name} {subtask}/0: {status}"
            assert (read(stage.admitted(subtask)) or {}).get("attempt") == 0, f"{run_id} {name} {subtask} admission"
        committed = read(stage.committed)
        assert committed is not None, f"{run_id} stage {name} not committed"
        assert {k: v["attempt"] for k, v in committed["subtasks"].items()} == {str(s): 0 for s in range(parallelism)}


def output_dir(dep: Deployment, dag_id: str, ds: str) -> Path:
    """Where ParquetSink commits the output of ``ds``."""
    return dep.cluster.output / dag_id / ds


def assert_output(dep: Deployment, dag_id: str, ds: str, run_id: str) -> dict[str, Any]:
    """The committed sink output of ``ds``: one manifest listing exactly the admitted attempt of each aggregate
    subtask, exactly the manifest's part files, no staging leftovers, and DuckDB's Q1. Returns the manifest."""
    output = output_dir(dep, dag_id, ds)
    assert output.is_dir(), f"{output} was not committed"
    manifest = read(output / "_SUCCESS")
    assert manifest is not None, f"{output} has no _SUCCESS manifest"
    assert (manifest["dag_id"], manifest["run_id"], manifest["stage"]) == (dag_id, run_id, "aggregate")
    aggregate = layout(dep, dag_id, run_id, "aggregate")
    admitted = {s: read(aggregate.admitted(s))["attempt"] for s in range(STAGES["aggregate"])}
    listed: dict[int, set[int]] = {}
    for entry in manifest["files"]:
        listed.setdefault(entry["subtask"], set()).add(entry["attempt"])
    assert listed == {s: {a} for s, a in admitted.items()}, f"{output}: manifest lists attempts {listed}"
    present = sorted(p.name for p in output.iterdir() if p.name != "_SUCCESS")
    assert sorted(f["path"] for f in manifest["files"]) == present, f"{output}: {present} vs the manifest"
    leftovers = [p.name for p in output.parent.iterdir() if p.name.startswith(f".{ds}.")]
    assert not leftovers, f"staging or old directories left next to {output}: {leftovers}"
    # read_q1_output also fails if a group appears twice (an appended or duplicated part).
    assert_q1_equal(read_q1_output(output), dep.expected, scales=output_decimal_scales(output))
    return manifest


# -- tests --------------------------------------------------------------------------------------


# Two dates are enough to show one output per date and no mixing between them; a third ran three more
# spark-submit JVMs at once on 2 cores (the test took 319 s with three).
BACKFILL_DATES = ("2026-02-01", "2026-02-02")


@pytest.mark.timeout(3600)
def test_backfill_commits_each_date_once_and_reprocessing_replaces_it(deployment: Deployment):
    with diagnosed(deployment, "backfill + reprocess"):
        check_backfill(deployment)


def backfill_runs(cluster: AirflowCluster) -> dict[str, str]:
    """ds -> run id of the backfill runs of DAG over BACKFILL_DATES."""
    runs = {}
    for run in cluster.dag_runs(DAG).values():
        ds = (run.get("logical_date") or "")[:10]
        if ds in BACKFILL_DATES:
            assert ds not in runs, f"two runs for {ds}: {runs[ds]} and {run['dag_run_id']}"
            assert run["run_type"] == "backfill", run
            runs[ds] = run["dag_run_id"]
    return runs


def check_backfill(dep: Deployment) -> None:
    cluster = dep.cluster
    started = time.monotonic()
    cluster.cli("backfill", "create", "--dag-id", DAG, "--from-date", BACKFILL_DATES[0],
                "--to-date", BACKFILL_DATES[-1])
    runs = wait_until(lambda: (r := backfill_runs(cluster)) and len(r) == len(BACKFILL_DATES) and r, 120,
                      "the backfill to create its runs", interval=1)
    final = cluster.wait_runs_finished(DAG, list(runs.values()), RUN_TIMEOUT)
    DURATIONS[f"backfill ({len(BACKFILL_DATES)} dates)"] = time.monotonic() - started
    assert {ds: r["state"] for ds, r in zip(runs, final.values(), strict=True)} == dict.fromkeys(runs, "success")
    assert len(cluster.dag_runs(DAG)) == len(BACKFILL_DATES), "the backfill created other runs too"

    first: dict[str, dict[str, Any]] = {}
    for ds, run_id in runs.items():
        assert_one_attempt_per_subtask(dep, DAG, run_id)
        manifest = assert_output(dep, DAG, ds, run_id)
        first[ds] = {"manifest": manifest, "inode": output_dir(dep, DAG, ds).stat().st_ino,
                     "end_date": final[run_id]["end_date"],
                     "committed": {s: read(layout(dep, DAG, run_id, s).committed)["committed_at"] for s in STAGES}}

    # The source changed since (one lineitem part replaced by another): reprocessing the completed dates must
    # recompute them and replace each date's output. A backfill must be complete (the scheduler marks it)
    # before another one can be created for the DAG.
    def backfills_complete() -> bool:
        answer = cluster.api("GET", f"/backfills?dag_id={DAG}")
        return bool(answer["backfills"]) and all(b["completed_at"] for b in answer["backfills"])

    wait_until(backfills_complete, 180, "the scheduler to mark the backfill complete", interval=1)
    old_expected = dep.expected
    replace_part(dep)
    assert dep.expected != old_expected, "the changed source must change Q1, or the test proves nothing"
    plans = {ds: {s: read(layout(dep, DAG, r, s).plan)["fingerprint"] for s in STAGES} for ds, r in runs.items()}
    started, reprocess_at = time.monotonic(), time.time()
    cluster.cli("backfill", "create", "--dag-id", DAG, "--from-date", BACKFILL_DATES[0],
                "--to-date", BACKFILL_DATES[-1], "--reprocess-behavior", "completed")

    def reprocessed() -> dict[str, dict[str, Any]] | None:
        cluster.check_alive()
        current = cluster.dag_runs(DAG)
        done = {r: current[r] for r in runs.values()
                if current[r]["state"] in ("success", "failed") and current[r]["end_date"] != final[r]["end_date"]}
        return done if len(done) == len(runs) else None

    again = wait_until(reprocessed, RUN_TIMEOUT, "the reprocessed runs to finish", interval=1)
    DURATIONS[f"reprocess ({len(BACKFILL_DATES)} dates)"] = time.monotonic() - started
    # Airflow reprocesses a completed date by clearing its run (same run id) and running it again.
    assert backfill_runs(cluster) == runs, "reprocessing must rerun the existing runs, not add runs"
    assert {r: again[r]["state"] for r in runs.values()} == dict.fromkeys(runs.values(), "success")
    for ds, run_id in runs.items():
        tis = cluster.task_instances(DAG, run_id)
        assert {t: tis[t]["try_number"] for t in STAGES} == dict.fromkeys(STAGES, 2), f"{run_id}: stages not rerun"
        for name in STAGES:
            stage = layout(dep, DAG, run_id, name)
            # Both stages were replanned (the aggregate because its input changed) and ran afresh, once.
            assert read(stage.plan)["fingerprint"] != plans[ds][name], f"{run_id} {name}: plan did not change"
            assert [e["event"] for e in journal(stage)].count("finalize_done") == 2
            assert read(stage.committed)["committed_at"] > first[ds]["committed"][name]
        assert_one_attempt_per_subtask(dep, DAG, run_id, since=reprocess_at)
        # The output of the date was replaced by a new commit of the new result, not appended to.
        manifest = assert_output(dep, DAG, ds, run_id)
        assert manifest["committed_at"] > first[ds]["manifest"]["committed_at"], f"{ds}: output not recommitted"
        assert output_dir(dep, DAG, ds).stat().st_ino != first[ds]["inode"], f"{ds}: directory not swapped"
    assert sorted(p.name for p in (cluster.output / DAG).iterdir()) == sorted(BACKFILL_DATES)


def replace_part(dep: Deployment) -> None:
    """Change the pipeline's source: replace its last lineitem part by the next one; update the expected Q1."""
    parts = sorted(LINEITEM.glob("lineitem.*.parquet"))
    assert len(parts) > PARTS, f"need a spare lineitem part in {LINEITEM}"
    shutil.copy(parts[PARTS], dep.data / parts[PARTS].name)
    (dep.data / parts[PARTS - 1].name).unlink()
    dep.expected = duckdb_q1(dep.data)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("component", "ds"), [("triggerer", "2026-03-01"), ("scheduler", "2026-03-02")])
def test_kill_9_mid_stage_then_restart(deployment: Deployment, component: str, ds: str):
    with diagnosed(deployment, f"kill -9 {component}"):
        check_kill_component(deployment, component, ds)


def check_kill_component(dep: Deployment, component: str, ds: str) -> None:
    cluster = dep.cluster
    run_id = cluster.trigger(BARRIER_DAG, f"{ds}T00:00:00+00:00")
    scan = layout(dep, BARRIER_DAG, run_id, "scan")
    attempts = wait_scan_held(dep, BARRIER_DAG, run_id)
    # The aggregate is deferred too, waiting in the triggerer for the scan's commit, when the component dies.
    aggregate = layout(dep, BARRIER_DAG, run_id, "aggregate")
    wait_until(lambda: (read(aggregate.dir / "task.json") or {}).get("state") == "waiting", 120,
               "the aggregate to wait in the triggerer for the scan's commit", interval=0.5)

    killed_at, since = time.time(), datetime.now(UTC)
    victims = cluster.kill(component)
    print(f"\nkill -9 {component} (process group):\n" + "\n".join(victims))
    assert victims, f"no {component} process was killed"
    # The attempts run in their own sessions: the crash did not take any Spark driver with it.
    for subtask, status in attempts.items():
        assert group_processes(status["pgid"]), f"scan attempt {subtask}/0 died with the {component}"

    cluster.start(component)
    cluster.wait_component_restarted(component, since)
    if component == "triggerer":
        # The new triggerer rebuilt the controller from the store and reconnected to both running attempts.
        restored = wait_until(lambda: [e for e in events(scan, "restored") if e["at"] > killed_at], 300,
                              "the restarted triggerer to restore the scan controller", interval=1)
        assert restored[0]["attempts"] == STAGES["scan"] and restored[0]["admitted"] == {}, restored
        for subtask, status in attempts.items():
            assert group_processes(status["pgid"]), f"scan attempt {subtask}/0 is gone before its release"
    release_scan(dep, BARRIER_DAG, run_id)

    final = cluster.wait_runs_finished(BARRIER_DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']}"
    assert_one_attempt_per_subtask(dep, BARRIER_DAG, run_id)
    assert_output(dep, BARRIER_DAG, ds, run_id)
    # The waiting aggregate planned once, on the scan's commit, and was committed in the triggerer.
    assert len(events(aggregate, "plan_decided")) == 1
    assert events(aggregate, "plan_decided")[0]["at"] >= read(scan.committed)["committed_at"]
    # The (restarted) triggerer committed the scan once and ended its task; no worker resumed it.
    assert [e.get("by") for e in events(scan, "finalize_done")] == ["triggerer"]
    assert cluster.task_instances(BARRIER_DAG, run_id)["scan"]["try_number"] == 1
    for subtask in range(STAGES["scan"]):
        status = read(scan.status(subtask, 0))
        assert status["end_at"] > killed_at, f"scan attempt {subtask}/0 ended before the {component} was killed"
    # Nothing of the run is left running.
    assert not processes_mentioning(str(scan.run_dir)), describe(processes_mentioning(str(scan.run_dir)))


COMMIT_DS = "2026-03-03"


def commit_held(cluster: AirflowCluster, held: Path, after: float) -> dict[str, Any] | None:
    """The ``hold_commit`` record of a trigger holding after ``after`` (epoch seconds), or None yet."""
    cluster.check_alive()
    record = read(held)
    return record if record and record["at"] > after else None


@pytest.mark.timeout(1800)
def test_kill_9_triggerer_between_its_commit_and_its_event(deployment: Deployment):
    with diagnosed(deployment, "kill -9 triggerer after commit"):
        check_kill_triggerer_after_commit(deployment)


def check_kill_triggerer_after_commit(dep: Deployment) -> None:
    """The scan's trigger wrote committed.json; its TaskSuccessEvent never left the dead triggerer. The restarted
    triggerer must commit the same attempts again (idempotent) and end the task, whose try stays 1."""
    cluster = dep.cluster
    run_id = cluster.trigger(COMMIT_DAG, f"{COMMIT_DS}T00:00:00+00:00")
    scan = layout(dep, COMMIT_DAG, run_id, "scan")
    held, release = scan.commit_hold()

    wait_until(lambda: commit_held(cluster, held, 0.0), RUN_TIMEOUT, "the scan trigger to commit and hold its event",
               interval=0.5)
    first = read(scan.committed)
    assert first is not None and {k: v["attempt"] for k, v in first["subtasks"].items()} == {"0": 0, "1": 0}
    assert cluster.task_instances(COMMIT_DAG, run_id)["scan"]["state"] == "deferred"

    killed_at, since = time.time(), datetime.now(UTC)
    victims = cluster.kill("triggerer")
    print("\nkill -9 triggerer (process group), after its commit:\n" + "\n".join(victims))
    assert victims, "no triggerer process was killed"
    cluster.start("triggerer")
    cluster.wait_component_restarted("triggerer", since)
    # The restarted triggerer's trigger found the stage decided and committed it again before its event.
    wait_until(lambda: commit_held(cluster, held, killed_at), RUN_TIMEOUT, "the restarted trigger to commit again",
               interval=0.5)
    again = read(scan.committed)
    assert again["subtasks"] == first["subtasks"] and again["fingerprint"] == first["fingerprint"]
    assert again["committed_at"] > killed_at
    release.write_text("go")

    final = cluster.wait_runs_finished(COMMIT_DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']}"
    assert [e.get("by") for e in events(scan, "finalize_done")] == ["triggerer", "triggerer"]
    assert cluster.task_instances(COMMIT_DAG, run_id)["scan"]["try_number"] == 1
    # Nothing was launched again: one attempt per subtask, each launched once; the output is exactly Q1.
    assert_one_attempt_per_subtask(dep, COMMIT_DAG, run_id)
    assert_output(dep, COMMIT_DAG, COMMIT_DS, run_id)
    assert not processes_mentioning(str(scan.run_dir)), describe(processes_mentioning(str(scan.run_dir)))


PUBLISH_DS = "2026-03-04"


@pytest.mark.timeout(1800)
def test_kill_9_triggerer_after_it_recorded_the_asset_event_through_the_api(deployment: Deployment):
    with diagnosed(deployment, "kill -9 triggerer after the REST asset event"):
        check_kill_triggerer_after_publish(deployment)


def check_kill_triggerer_after_publish(dep: Deployment) -> None:
    """The sink stage's trigger committed, recorded its asset event through the api-server and was killed before
    its event. Its record of the event is then dropped from the store, as if it had died between the
    api-server recording the POST and the record being written (the answer lost). The restarted triggerer
    commits again, finds the event through the real api-server by its key instead of posting it again, and
    ends the task without a worker: one asset event."""
    cluster = dep.cluster
    # Only e2e_q1_publish names this connection ([speculative] asset_events_conn_id in its aggregate's config).
    cluster.cli("connections", "add", "e2e_asset_api", "--conn-type", "http", "--conn-host", cluster.base_url,
                "--conn-login", "publisher", "--conn-password", "not-checked-with-all-admins")
    run_id = cluster.trigger(PUBLISH_DAG, f"{PUBLISH_DS}T00:00:00+00:00")
    aggregate = layout(dep, PUBLISH_DAG, run_id, "aggregate")
    held, release = aggregate.commit_hold()
    sink_uri = output_dir(dep, PUBLISH_DAG, PUBLISH_DS).parent.as_uri()

    def sink_events() -> list[dict[str, Any]]:
        answer = cluster.api("GET", "/assets/events?limit=100&order_by=-timestamp")
        return [e for e in answer["asset_events"] if e["uri"] == sink_uri and e["extra"].get("run_id") == run_id]

    wait_until(lambda: commit_held(cluster, held, 0.0), RUN_TIMEOUT, "the aggregate trigger to commit, record and hold",
               interval=0.5)
    (event,) = sink_events()
    assert event["extra"]["from_rest_api"] is True and event["source_task_id"] is None
    assert event["extra"]["speculative_commit"] == f"{PUBLISH_DAG}/{run_id}/aggregate/try-1"

    since = datetime.now(UTC)
    victims = cluster.kill("triggerer")
    print("\nkill -9 triggerer (process group), after the REST asset event:\n" + "\n".join(victims))
    assert victims, "no triggerer process was killed"
    killed_at = time.time()
    state_path = aggregate.dir / "asset_events.json"
    state = read(state_path)
    assert state is not None and state["events"] == {sink_uri: event["id"]}, state
    state_path.write_text(json.dumps({**state, "events": {}}))  # the dead triggerer never wrote the event's id
    cluster.start("triggerer")
    cluster.wait_component_restarted("triggerer", since)
    wait_until(lambda: commit_held(cluster, held, killed_at), RUN_TIMEOUT, "the restarted trigger to commit again",
               interval=0.5)
    release.write_text("go")

    final = cluster.wait_runs_finished(PUBLISH_DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']}"
    # The successor looked the event up by its key (GET /api/v2/assets/events) and posted nothing: one event.
    assert [e["id"] for e in sink_events()] == [event["id"]]
    assert [(e["event_id"], e["found_earlier"]) for e in events(aggregate, "asset_event_recorded")] == [
        (event["id"], False), (event["id"], True)]
    assert read(state_path)["events"] == {sink_uri: event["id"]}
    assert [e.get("by") for e in events(aggregate, "finalize_done")] == ["triggerer", "triggerer"]
    ti = cluster.task_instances(PUBLISH_DAG, run_id)["aggregate"]
    assert ti["try_number"] == 1 and not ti.get("hostname"), f"a worker ran the sink task: {ti}"
    assert_one_attempt_per_subtask(dep, PUBLISH_DAG, run_id)
    assert_output(dep, PUBLISH_DAG, PUBLISH_DS, run_id)


WORKER_DS = "2026-04-01"


@pytest.mark.timeout(1800)
def test_kill_9_worker_before_finalize_retries_without_relaunching(deployment: Deployment):
    with diagnosed(deployment, "kill -9 worker"):
        check_kill_worker(deployment)


def check_kill_worker(dep: Deployment) -> None:
    """Both stage tasks are held right after their controller decided the stage, before finalize; the task
    process is killed there. The retry must re-plan, reuse the admitted attempts and commit."""
    cluster = dep.cluster
    for name in STAGES:
        (dep.control / f"hold.{WORKER_DAG}.{name}.{WORKER_DS}").write_text("hold")
    run_id = cluster.trigger(WORKER_DAG, f"{WORKER_DS}T00:00:00+00:00")
    killed = {}
    for name, parallelism in STAGES.items():
        stage = layout(dep, WORKER_DAG, run_id, name)
        held_file = dep.control / f"held.{WORKER_DAG}.{name}.{WORKER_DS}"

        def held(held_file: Path = held_file) -> dict[str, Any] | None:
            cluster.check_alive()
            return read(held_file)

        marker = wait_until(held, RUN_TIMEOUT, f"{name} to resume for finalize and be held", interval=1)
        # The stage is decided (every subtask admitted) but not committed.
        assert [e["event"] for e in journal(stage)].count("stage_complete") == 1
        assert all(stage.admitted(s).exists() for s in range(parallelism))
        assert not stage.committed.exists(), f"{name} committed before finalize"
        assert marker["try_number"] == 1
        task = psutil.Process(marker["pid"])
        worker = psutil.Process(marker["ppid"])
        assert "LocalExecutor" in " ".join(worker.cmdline()), f"not a LocalExecutor worker: {worker.cmdline()}"
        killed[name] = " ".join(task.cmdline())
        task.kill()  # kill -9 the process executing the task
        wait_until(lambda task=task: not task.is_running() or task.status() == psutil.STATUS_ZOMBIE, 30,
                   f"the {name} task process to die", interval=0.2)
        (dep.control / f"hold.{WORKER_DAG}.{name}.{WORKER_DS}").unlink()
    print(f"\nkilled task processes: {killed}")

    final = cluster.wait_runs_finished(WORKER_DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']}"
    tis = cluster.task_instances(WORKER_DAG, run_id)
    assert {t: tis[t]["try_number"] for t in STAGES} == dict.fromkeys(STAGES, 2), "each killed task ran again"
    for name in STAGES:
        stage = layout(dep, WORKER_DAG, run_id, name)
        # The retry's controller found every subtask admitted and launched nothing.
        restored = events(stage, "restored")
        assert restored and restored[-1]["admitted"] == {str(s): 0 for s in range(STAGES[name])}, restored
        assert [e["event"] for e in journal(stage)].count("finalize_done") == 1
    assert_one_attempt_per_subtask(dep, WORKER_DAG, run_id)
    assert_output(dep, WORKER_DAG, WORKER_DS, run_id)


MARK_FAILED_DS = "2026-05-01"


@pytest.mark.timeout(1800)
def test_mark_failed_leaves_no_spark_driver(deployment: Deployment):
    with diagnosed(deployment, "mark failed"):
        check_mark_failed(deployment)


def check_mark_failed(dep: Deployment) -> None:
    cluster = dep.cluster
    run_id = cluster.trigger(BARRIER_DAG, f"{MARK_FAILED_DS}T00:00:00+00:00")
    scan = layout(dep, BARRIER_DAG, run_id, "scan")
    attempts = wait_scan_held(dep, BARRIER_DAG, run_id)
    drivers = [p for s in attempts.values() for p in group_processes(s["pgid"]) if is_spark(p)]
    assert drivers, "no Spark driver is running for the held scan attempts"
    assert cluster.task_instances(BARRIER_DAG, run_id)["scan"]["state"] == "deferred"

    marked_at = time.time()
    path = f"/dags/{BARRIER_DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/scan"
    cluster.api("PATCH", path, {"new_state": "failed"})

    # The triggerer cancels the trigger; its on_kill cancels every attempt, reaps the process groups and only
    # then journals killed_all with the attempts it could not reap.
    killed = wait_until(lambda: [e for e in events(scan, "killed_all") if e["at"] >= marked_at], 120,
                        "the trigger's on_kill to journal killed_all", interval=0.5,
                        on_timeout=lambda: f"journal: {journal(scan)[-5:]}")
    assert killed[0]["left"] == [], f"on_kill could not reap: {killed[0]}"

    def all_gone() -> bool:
        return not any(group_processes(s["pgid"]) for s in attempts.values()) \
            and not processes_mentioning(str(scan.run_dir))

    wait_until(all_gone, 30, "every process of the scan attempts to be gone", interval=0.5,
               on_timeout=lambda: describe(processes_mentioning(str(scan.run_dir))))
    for subtask in range(STAGES["scan"]):
        assert read(scan.status(subtask, 0))["state"] == "CANCELED"
        assert not scan.manifest(subtask, 0).exists()
    final = cluster.wait_runs_finished(BARRIER_DAG, [run_id], 300)[run_id]
    assert final["state"] == "failed"
    assert not output_dir(dep, BARRIER_DAG, MARK_FAILED_DS).exists()


EAGER_DS = "2026-06-01"


@pytest.mark.timeout(1800)
def test_a_consumer_waits_in_the_triggerer_and_a_cleared_producer_is_never_read_stale(deployment: Deployment):
    with diagnosed(deployment, "clear producer with downstream"):
        check_clear_producer(deployment)


def check_clear_producer(dep: Deployment) -> None:
    cluster = dep.cluster
    run_id = cluster.trigger(EAGER_DAG, f"{EAGER_DS}T00:00:00+00:00")
    final = cluster.wait_runs_finished(EAGER_DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']}"
    scan, aggregate = (layout(dep, EAGER_DAG, run_id, name) for name in STAGES)
    first_scan = read(scan.committed)
    assert first_scan is not None and first_scan["try_number"] == 1
    # The triggerer rendered the scan's templated fields before planning it ({{ run_id }}, {{ params.lineitem }}).
    scan_plan = read(scan.plan)
    assert scan_plan["application_args"] == ["--run", run_id]
    assert scan_plan["subtasks"][0]["inputs"]["lineitem"]["files"][0]["path"].startswith(str(dep.data.resolve()))
    # The aggregate was deferred from the run's start and waited in the triggerer for the scan's commit.
    waited = events(aggregate, "inputs_committed")
    assert len(waited) == 1 and events(aggregate, "plan_decided")[0]["at"] >= first_scan["committed_at"]
    assert [e.get("by") for e in events(aggregate, "finalize_done")] == ["triggerer"]
    assert_output(dep, EAGER_DAG, EAGER_DS, run_id)

    cleared_at = time.time()
    cluster.api("POST", f"/dags/{EAGER_DAG}/clearTaskInstances", {
        "dag_run_id": run_id, "task_ids": ["scan"], "include_downstream": True, "only_failed": False,
        "dry_run": False, "reset_dag_runs": True})

    def recommitted() -> bool:
        cluster.check_alive()
        record = read(aggregate.committed)
        return bool(record and record["committed_at"] > cleared_at)

    wait_until(recommitted, RUN_TIMEOUT, "the cleared run to commit the aggregate again", interval=1)
    final = cluster.wait_runs_finished(EAGER_DAG, [run_id], RUN_TIMEOUT)[run_id]
    assert final["state"] == "success", f"run {run_id} is {final['state']} after the clear"
    second_scan, second_agg = read(scan.committed), read(aggregate.committed)
    assert (second_scan["try_number"], second_agg["try_number"]) == (2, 2)
    # The consumer planned after the producer's new commit, not on the old one it could already see.
    replans = [e["at"] for e in events(aggregate, "plan_decided") if e["at"] > cleared_at]
    assert replans and min(replans) >= second_scan["committed_at"], (replans, second_scan["committed_at"])
    assert_output(dep, EAGER_DAG, EAGER_DS, run_id)


BROKEN_DS = "2026-06-02"


@pytest.mark.timeout(1800)
def test_a_failed_producer_fails_its_waiting_consumer_naming_it(deployment: Deployment):
    with diagnosed(deployment, "failed producer"):
        cluster = deployment.cluster
        run_id = cluster.trigger(BROKEN_DAG, f"{BROKEN_DS}T00:00:00+00:00")
        final = cluster.wait_runs_finished(BROKEN_DAG, [run_id], RUN_TIMEOUT)[run_id]
        assert final["state"] == "failed"
        tis = cluster.task_instances(BROKEN_DAG, run_id)
        assert (tis["scan"]["state"], tis["scan"]["try_number"]) == ("failed", 2)  # retried once, then failed
        # The consumer failed as soon as Airflow said its producer failed: once, without a retry.
        assert (tis["aggregate"]["state"], tis["aggregate"]["try_number"]) == ("failed", 1)
        task = read(layout(deployment, BROKEN_DAG, run_id, "aggregate").dir / "task.json")
        assert task["state"] == "failed" and "producer stage 'scan' is failed" in task["reason"], task
        assert "no_such_scan.py" in read(layout(deployment, BROKEN_DAG, run_id, "scan").dir / "task.json")["reason"]
        assert not output_dir(deployment, BROKEN_DAG, BROKEN_DS).exists()


def test_no_spark_process_left_after_shutdown(deployment: Deployment):
    """Last: stop the deployment; nothing of the store may still run."""
    with diagnosed(deployment, "shutdown"):
        deployment.cluster.stop()
        store = deployment.cluster.store
        wait_until(lambda: not processes_mentioning(str(store)), 30, "every attempt process to have exited",
                   interval=0.5, on_timeout=lambda: describe(processes_mentioning(str(store))))
        spark = [p for p in processes_mentioning(str(deployment.cluster.root)) if is_spark(p)]
        assert not spark, f"Spark processes left behind:\n{describe(spark)}"
