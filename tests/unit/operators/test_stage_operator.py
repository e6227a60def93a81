"""SparkStageOperator.execute and execute_complete on a temporary store (no Spark: attempts are faked)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_speculative import Pipeline, parquet_source
from airflow_provider_speculative.exceptions import PlanError, StageFailedError, TargetError
from airflow_provider_speculative.store.files import atomic_write_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
from tests.factories import FakeTI


def _operator(tmp_path: Path, targets: list[dict[str, Any]] | None = None) -> Any:
    config = {"targets": targets} if targets else {}
    with Pipeline("p", config=config) as pipeline:
        stage = pipeline.stage("scan", application=str(tmp_path / "app.py"), parallelism=2,
                               inputs={"src": parquet_source(str(tmp_path / "src"))})
    return stage.task


def _context(run_id: str = "r1") -> dict[str, Any]:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": run_id, "ti": FakeTI(),
            "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}


def _execute(op: Any) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context())
    return deferred.value


def _finish(layout: StageLayout, subtask: int, attempt: int) -> None:
    """What a finished attempt leaves: claim, data, manifest; and its admission."""
    atomic_write_json(layout.claim(subtask, attempt), {"target": "local-a", "created_at": 1.0})
    data = layout.data(subtask, attempt)
    data.mkdir(parents=True)
    pq.write_table(pa.table({"k": [subtask]}), data / "part-0.parquet")
    write_manifest(layout.manifest(subtask, attempt), build_manifest(data, stage="scan", subtask=subtask,
                                                                     attempt=attempt, records=1))
    atomic_write_json(layout.admitted(subtask), {"attempt": attempt, "at": 1.0})


def test_execute_writes_the_plan_and_defers_once(env: Path) -> None:
    deferred = _execute(_operator(env))
    plan = read_json(deferred.trigger.plan_path)
    assert plan["parallelism"] == 2 and plan["stage"] == "scan" and plan["pipeline"] == "p"
    assert {t["kind"] for t in plan["targets"].values()} == {"spark_submit"}
    assert all(t["command"][-1] == str(env / "app.py") for t in plan["targets"].values())
    assert deferred.method_name == "execute_complete"


def test_auto_parallelism_is_decided_at_plan_time_and_journaled(env: Path) -> None:
    # Three tiny files at 1 byte per subtask: bytes ask for many subtasks, the files bound it to 3.
    pq.write_table(pa.table({"k": [2], "v": [20]}), env / "src" / "part-2.parquet")
    with Pipeline("p", config={"data_volume_per_subtask": 1}) as pipeline:
        stage = pipeline.stage("scan", application=str(env / "app.py"), parallelism="auto", min_parallelism=1,
                               max_parallelism=8, inputs={"src": parquet_source(str(env / "src"))})
    plan = read_json(_execute(stage.task).trigger.plan_path)
    decision = plan["parallelism_decision"]
    assert plan["parallelism"] == len(plan["subtasks"]) == decision["chosen"] == 3
    assert (decision["mode"], decision["files"], decision["bounded_by"], decision["per_subtask"]) == \
        ("auto", 3, "files", 1)
    journal = read_jsonl(StageLayout(env / "store", "d", "r1", "scan").journal)
    assert [e["decision"]["chosen"] for e in journal if e["event"] == "plan_decided"] == [3]
    # The read model behind `airflow speculative status` and the stage view carries it as one line.
    from airflow_provider_speculative.control.readmodel import stage_report

    report = stage_report(StageLayout(env / "store", "d", "r1", "scan"), plan)
    assert report["parallelism_line"].startswith("auto: ") and report["parallelism_line"].endswith(
        ": 3 (bounded by files)")
    assert report["plan_warnings"] == []


def test_a_replanned_equal_stage_keeps_its_admissions_and_invalidates_broken_ones(env: Path) -> None:
    op = _operator(env)
    layout = StageLayout(env / "store", "d", "r1", "scan")
    _execute(op)
    _finish(layout, 0, 0)
    _finish(layout, 1, 0)
    layout.manifest(1, 0).unlink()  # subtask 1's committed output was lost since

    _execute(op)  # a retry of the task: same inputs, same fingerprint

    assert read_json(layout.admitted(0)) == {"attempt": 0, "at": 1.0}
    assert not (layout.attempt_dir(0, 0) / "invalidated.json").exists()
    assert "manifest missing" in read_json(layout.attempt_dir(1, 0) / "invalidated.json")["reason"]
    assert not layout.admitted(1).exists()


def _finished_stage(env: Path) -> tuple[Any, Any, StageLayout]:
    """A deferred two-subtask stage whose subtask 0 finished attempt 0 and subtask 1 attempt 2."""
    op = _operator(env)
    deferred = _execute(op)
    layout = StageLayout(env / "store", "d", "r1", "scan")
    _finish(layout, 0, 0)
    _finish(layout, 1, 2)
    return op, deferred, layout


def test_execute_complete_commits_the_admitted_attempts(env: Path) -> None:
    op, deferred, layout = _finished_stage(env)
    result = op.execute_complete(_context(), {"status": "success", "plan_path": deferred.trigger.plan_path,
                                              "admitted": {"0": 0, "1": 2}, "summary": {}})
    committed = read_json(layout.committed)
    assert {k: v["attempt"] for k, v in committed["subtasks"].items()} == {"0": 0, "1": 2}
    assert result["committed"] == str(layout.committed)


@pytest.mark.parametrize("event", [None, {"status": "maybe"}, {"status": "success"},
                                   {"status": "success", "plan_path": "PLAN"}])
def test_a_malformed_event_gets_a_clear_error(env: Path, event: Any) -> None:
    op = _operator(env)
    plan_path = _execute(op).trigger.plan_path
    if isinstance(event, dict) and event.get("plan_path") == "PLAN":
        event = {**event, "plan_path": plan_path}
    with pytest.raises(StageFailedError, match=r"pipeline 'p', stage 'scan': malformed controller event"):
        op.execute_complete(_context(), event)


def test_a_failed_stage_reports_counts_and_first_causes(env: Path) -> None:
    op = _operator(env)
    plan_path = _execute(op).trigger.plan_path
    event = {"status": "failed", "plan_path": plan_path, "reason": "12 failed attempts in this stage run",
             "causes": ["subtask 0 attempt 0 on local-a (node local-a): exit code 1, boom"],
             "failed_attempts": 12, "counts_by_cause": {"boom": 12}}
    with pytest.raises(StageFailedError) as failure:
        op.execute_complete(_context(), event)
    text = str(failure.value)
    assert "pipeline 'p', stage 'scan' failed: 12 failed attempts" in text
    assert "12 x boom" in text and "and 11 more failed attempts" in text


def test_a_failed_stage_says_where_the_attempt_logs_are_and_shows_the_first_ones_end(env: Path) -> None:
    op = _operator(env)
    plan_path = _execute(op).trigger.plan_path
    layout = StageLayout(env / "store", "d", "r1", "scan")
    layout.log(1, 2).parent.mkdir(parents=True, exist_ok=True)
    layout.log(1, 2).write_text("".join(f"INFO step {i}\n" for i in range(50)) + "ValueError: bad row " + "x" * 2000)
    event = {"status": "failed", "plan_path": plan_path, "reason": "2 failed attempts",
             "causes": ["subtask 1 attempt 2 on local-a (node local-a): exit code 1, ValueError: bad row"],
             "failed_attempts": 1, "counts_by_cause": {"ValueError": 1}, "failed_keys": [[1, 2]]}
    with pytest.raises(StageFailedError) as failure:
        op.execute_complete(_context(), event)
    lines = str(failure.value).splitlines()
    assert f"{layout.dir}/subtask=<i>/attempt=<k>/spark-submit.log" in lines[3]
    assert "airflow speculative logs -d d -r r1 -s scan --subtask 1 --attempt 2" in lines[3]
    tail = lines[lines.index("last 20 lines of subtask 1 attempt 2's log:") + 1:]
    assert tail[0] == "  | INFO step 31" and tail[-1].startswith("  | ValueError: bad row xxx")
    assert tail[-1].endswith(" [...]") and len(tail[-1]) < 420  # one long line cannot flood the task log


def test_unknown_target_connection_fails_at_plan_time(env: Path) -> None:
    op = _operator(env, targets=[{"name": "far", "conn_id": "no_such_conn"}])
    with pytest.raises(TargetError, match=r"pipeline 'p', stage 'scan': target 'far' uses connection 'no_such_conn'"):
        op.execute(_context())


def test_missing_application_fails_at_plan_time(env: Path) -> None:
    (env / "app.py").unlink()
    with pytest.raises(PlanError, match=r"pipeline 'p', stage 'scan': application .*app.py' does not exist"):
        _operator(env).execute(_context())


def test_reactive_target_needs_a_standalone_master_and_its_web_ui_at_plan_time(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # spark_default is local[1]: slots 'auto' reads a standalone master's workers, so it is refused.
    op = _operator(env, targets=[{"name": "c", "slots": "auto", "master_ui": "http://m:8080"}])
    with pytest.raises(TargetError, match=r"pipeline 'p', stage 'scan': target 'c' has slots 'auto'.*spark://"):
        op.execute(_context())
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", '{"conn_type": "spark", "host": "spark://m:7077"}')
    op = _operator(env, targets=[{"name": "c", "conn_id": "spark_cluster", "slots": "auto"}])
    with pytest.raises(TargetError, match=r"target 'c' has slots 'auto' but no master web UI URL"):
        op.execute(_context())
    # From the connection's extra: recorded in the plan for the controller.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", '{"conn_type": "spark", "host": "spark://m:7077", '
                                                     '"extra": {"master_ui": "http://m:8080/"}}')
    deferred = _execute(_operator(env, targets=[{"name": "c", "conn_id": "spark_cluster", "slots": "auto"}]))
    plan = json.loads(Path(deferred.trigger.plan_path).read_text())
    assert plan["targets"]["c"]["master_ui"] == "http://m:8080"


def _session(layout: StageLayout, subtask: int, attempt: int, app_id: str) -> None:
    """An attempt that reached its Spark session: the runtime records the application id in its heartbeat."""
    atomic_write_json(layout.claim(subtask, attempt), {"target": "local-a", "created_at": 1.0})
    atomic_write_json(layout.heartbeat(subtask, attempt), {"node": "local-a", "app_id": app_id})


def test_execute_complete_pushes_the_spark_application_ids_under_stable_keys(env: Path) -> None:
    op, deferred, layout = _finished_stage(env)
    _session(layout, 0, 0, "local-1")
    _session(layout, 1, 1, "local-2")  # the loser of subtask 1
    _session(layout, 1, 2, "local-3")
    context = _context()
    op.execute_complete(context, {"status": "success", "plan_path": deferred.trigger.plan_path,
                                  "admitted": {"0": 0, "1": 2}, "summary": {}})
    assert context["ti"].xcoms == {"spark_app_ids": {"0": ["local-1"], "1": ["local-2", "local-3"]},
                                   "spark_admitted_app_ids": {"0": "local-1", "1": "local-3"}}


def test_a_failed_stage_pushes_the_application_ids_of_its_attempts_too(env: Path) -> None:
    op = _operator(env)
    plan_path = _execute(op).trigger.plan_path
    layout = StageLayout(env / "store", "d", "r1", "scan")
    _session(layout, 1, 0, "local-9")
    context = _context()
    with pytest.raises(StageFailedError):
        op.execute_complete(context, {"status": "failed", "plan_path": plan_path, "reason": "1 failed attempt",
                                      "causes": ["subtask 1 attempt 0: exit code 1"], "failed_attempts": 1,
                                      "counts_by_cause": {"exit code 1": 1}})
    assert context["ti"].xcoms == {"spark_app_ids": {"1": ["local-9"]}, "spark_admitted_app_ids": {}}


def test_a_push_that_fails_does_not_hide_the_stage_failure_or_skip_its_task_state(env: Path) -> None:
    op = _operator(env)
    plan_path = _execute(op).trigger.plan_path
    layout = StageLayout(env / "store", "d", "r1", "scan")
    _session(layout, 1, 0, "local-9")
    context = _context()

    def broken(key: str, value: object) -> None:
        raise RuntimeError("metadata database unreachable")

    context["ti"].xcom_push = broken
    with pytest.raises(StageFailedError, match="1 failed attempt"):
        op.execute_complete(context, {"status": "failed", "plan_path": plan_path, "reason": "1 failed attempt",
                                      "causes": ["subtask 1 attempt 0: exit code 1"], "failed_attempts": 1,
                                      "counts_by_cause": {"exit code 1": 1}})
    # Hybrid consumers go by the recorded task state: it is written before the push is tried.
    assert read_json(layout.task_state)["state"] == "failed"


def test_a_replanned_stage_stops_its_connect_attempts_with_the_connections_token(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.control import planning

    monkeypatch.setenv("AIRFLOW_CONN_SC", '{"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15101, '
                                          '"password": "the-token"}')
    targets = [{"name": "a", "conn_id": "sc"}, {"name": "b", "conn_id": "sc"}]
    kills: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(planning, "kill_stage", lambda plan, reason, **kw: kills.append((reason, kw)))
    _execute(_operator(env, targets))
    forced = {**_context(), "dag_run": SimpleNamespace(conf={"speculative_force_rerun": True})}
    with pytest.raises(TaskDeferred):
        _operator(env, targets).execute(forced)
    ((reason, kwargs),) = kills
    assert reason == "full rerun forced"
    assert set(kwargs["target_env"]) == {"a", "b"}
    assert all("the-token" in env["SPECULATIVE_SPARK_REMOTE"] for env in kwargs["target_env"].values())
