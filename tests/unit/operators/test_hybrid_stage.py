"""A hybrid consumer stage's task: trigger rule, waiting for the producer's plan, planning on it, failing clearly."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_speculative import Pipeline, all_to_all, parquet_source, pointwise
from airflow_provider_speculative.exceptions import StageFailedError
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.task_state import record_task_state
from airflow_provider_speculative.triggers.hybrid import HybridInputsTrigger


def _pipeline(tmp_path: Path, mode: str = "hybrid") -> dict[str, Any]:
    from airflow.sdk import DAG

    with DAG(f"d_{mode}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), Pipeline("p") as pipeline:
        scan = pipeline.stage("scan", application=str(tmp_path / "app.py"), parallelism=2,
                              inputs={"src": parquet_source(str(tmp_path / "src"))})
        enrich = pipeline.stage("enrich", application=str(tmp_path / "app.py"), parallelism=2,
                                inputs={"rows": pointwise(scan, mode=mode)})
        pipeline.stage("agg", application=str(tmp_path / "app.py"), parallelism=2,
                       inputs={"rows": all_to_all(enrich, key="k", mode=mode)})
    return {name: stage.task for name, stage in pipeline.stages.items()}


def _context(clear_number: int = 0, try_number: int = 1) -> dict[str, Any]:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": "r1", "ti": SimpleNamespace(try_number=try_number),
            "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
            "dag_run": SimpleNamespace(conf={}, clear_number=clear_number)}


def _defer(task: Any, context: dict[str, Any] | None = None) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context or _context())
    return deferred.value


def test_only_stages_fed_by_hybrid_edges_alone_start_with_their_producers(env: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = _pipeline(env)
    assert tasks["scan"].trigger_rule == "all_success"
    assert tasks["enrich"].trigger_rule == "always" and tasks["agg"].trigger_rule == "always"
    # Blocking consumers started in the triggerer (the default) wait there for commits from the run's start;
    # started on a worker they keep Airflow's rule.
    assert _pipeline(env, mode="blocking")["enrich"].trigger_rule == "always"
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__START_IN_TRIGGERER", "false")
    assert _pipeline(env, mode="blocking")["enrich"].trigger_rule == "all_success"


def test_a_consumer_waits_in_a_trigger_for_the_producer_plan_then_plans_on_it(env: Path) -> None:
    tasks = _pipeline(env)
    waiting = _defer(tasks["enrich"])
    assert isinstance(waiting.trigger, HybridInputsTrigger) and waiting.method_name == "resume_after_inputs"
    assert waiting.trigger.check() is None  # no producer plan yet
    producer = _defer(tasks["scan"])
    assert waiting.trigger.check() == {"status": "ready"}
    planned = _defer(tasks["enrich"])
    plan = read_json(planned.trigger.plan_path)
    scan_plan = read_json(producer.trigger.plan_path)
    rows = plan["inputs"]["rows"]
    assert rows["mode"] == "hybrid" and rows["upstream_fingerprint"] == scan_plan["fingerprint"]
    assert [s["inputs"]["rows"]["producers"] for s in plan["subtasks"]] == [[0, 1], [1, 2]]
    # The all_to_all hybrid consumer plans equal-count ranges on the pointwise consumer's plan.
    agg = read_json(_defer(tasks["agg"]).trigger.plan_path)
    assert [s["inputs"]["rows"]["producers"] for s in agg["subtasks"]] == [[0, 2], [0, 2]]


def test_a_producer_plan_from_before_the_last_clear_is_not_used(env: Path) -> None:
    tasks = _pipeline(env)
    _defer(tasks["scan"])  # planned in clear 0, not committed
    waiting = _defer(tasks["enrich"], _context(clear_number=1))
    assert isinstance(waiting.trigger, HybridInputsTrigger) and waiting.trigger.check() is None


def test_a_failed_producer_fails_the_consumer_naming_pipeline_stage_and_input(env: Path) -> None:
    tasks = _pipeline(env)
    layout = StageLayout(env / "store", "d", "r1", "scan")
    record_task_state(layout, "failed", try_number=1, clear_number=0, reason="PlanError: no files")
    with pytest.raises(StageFailedError, match=r"pipeline 'p', stage 'enrich', input 'rows': hybrid producer "
                                               r"stage 'scan' failed \(try 1\): PlanError: no files"):
        tasks["enrich"].execute(_context())
    # The consumer's own failure is recorded for its hybrid consumers in turn.
    assert read_json(StageLayout(env / "store", "d", "r1", "enrich").dir / "task.json")["state"] == "failed"


def test_the_producer_task_records_its_state(env: Path) -> None:
    tasks = _pipeline(env)
    _defer(tasks["scan"])
    state = read_json(StageLayout(env / "store", "d", "r1", "scan").dir / "task.json")
    assert state["state"] == "deferred" and state["try_number"] == 1 and state["clear_number"] == 0


def test_resuming_reschedules_while_waiting_and_fails_naming_the_input(env: Path) -> None:
    from airflow.sdk.exceptions import AirflowRescheduleException

    task = _pipeline(env)["enrich"]
    with pytest.raises(AirflowRescheduleException):
        task.resume_after_inputs(_context(), {"status": "waiting"})
    reason = "pipeline 'p', stage 'enrich', input 'rows': hybrid producer stage 'scan' failed (try 1): x"
    with pytest.raises(StageFailedError, match="input 'rows'"):
        task.resume_after_inputs(_context(), {"status": "failed", "reason": reason})


def test_a_failure_upstream_of_the_hybrid_producer_fails_the_consumer(env: Path) -> None:
    tasks = _pipeline(env)
    # agg's producer enrich has not planned (it waits for scan); scan failed: agg must not wait for ever.
    record_task_state(StageLayout(env / "store", "d", "r1", "scan"), "failed", try_number=1, clear_number=0,
                      reason="boom")
    with pytest.raises(StageFailedError, match=r"stage 'agg', input 'rows' \(enrich\): upstream stage 'scan' of "
                                               r"the hybrid producer failed \(try 1\): boom"):
        tasks["agg"].execute(_context())
