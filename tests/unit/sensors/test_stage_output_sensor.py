"""StageOutputSensor and StageOutputTrigger against a real store on tmp_path (reschedule and deferrable modes)."""

from __future__ import annotations

import asyncio
import importlib
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk.exceptions import AirflowRescheduleException, AirflowSensorTimeout, AirflowSkipException, TaskDeferred

from airflow_provider_speculative import StageOutputSensor
from airflow_provider_speculative.control.stage_output import StageOutputLocator
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import write_committed
from airflow_provider_speculative.triggers.stage_output import StageOutputTrigger
from tests.factories import stage_plan, write_plan

DAY = pendulum.datetime(2026, 1, 1, tz="UTC")


def plan(root: Path, run_id: str, logical_date: Any, stage: str = "aggregate", dag_id: str = "up") -> StageLayout:
    """What the operator writes before deferring: the stage's plan.json with the run's logical date."""
    return write_plan(stage_plan(root, dag_id=dag_id, run_id=run_id, stage=stage,
                                 logical_date=logical_date.isoformat() if logical_date else None))


def commit(layout: StageLayout, subtasks: int = 2, at: float = 1.0) -> None:
    """What finalize writes: the committed record (two subtasks; subtask s wrote subpartition s)."""
    write_committed(layout, {"stage": layout.stage, "parallelism": subtasks, "committed_at": at, "subtasks": {
        str(s): {"attempt": 0, "data": "/d", "files": [{"path": "p", "size": 5, "subpartition": s}],
                 "records": 1} for s in range(subtasks)}})


def context(logical_date: Any = DAY, first_reschedule: Any = None) -> dict[str, Any]:
    ti = SimpleNamespace(try_number=1, get_first_reschedule_date=lambda ctx: first_reschedule)
    return {"dag": SimpleNamespace(dag_id="down"), "run_id": "down_run", "ti": ti, "logical_date": logical_date}


# -- locator ---------------------------------------------------------------------------------


def test_the_run_is_found_by_logical_date_whatever_its_run_id(tmp_path: Path) -> None:
    plan(tmp_path, "scheduled__2025-12-31T00:00:00+00:00", DAY.subtract(days=1))
    target = plan(tmp_path, "manual__2026-01-01T09:13:00+00:00", DAY)
    locator = StageOutputLocator(tmp_path, "up", "aggregate", logical_date=DAY.isoformat())
    first = locator.check()
    assert not first.ready and first.run_id == "manual__2026-01-01T09:13:00+00:00"
    assert "stage not committed yet" in first.message
    commit(target)
    second = locator.check()
    assert second.ready and second.committed_path == str(target.committed)


def test_run_dirs_of_other_dates_are_read_once(tmp_path: Path) -> None:
    other = plan(tmp_path, "r_old", DAY.subtract(days=1))
    locator = StageOutputLocator(tmp_path, "up", "aggregate", logical_date=DAY.isoformat())
    assert locator.check().run_id is None
    other.plan.write_text("{not json")  # a second read would raise; the directory is skipped instead
    assert "no run of that DAG" in locator.check().message


def test_a_run_is_dated_by_a_sibling_stage_plan_before_its_own_stage_is_planned(tmp_path: Path) -> None:
    plan(tmp_path, "r1", DAY, stage="scan")
    observation = StageOutputLocator(tmp_path, "up", "aggregate", logical_date=DAY.isoformat()).check()
    assert observation.run_id == "r1" and "stage not committed yet" in observation.message


def test_by_run_id_and_with_subtask_and_subpartition_filters(tmp_path: Path) -> None:
    layout = plan(tmp_path, "manual:1+x", DAY)
    commit(layout, subtasks=2)
    assert StageOutputLocator(tmp_path, "up", "aggregate", run_id="manual:1+x", subtasks=[0, 1]).check().ready
    missing = StageOutputLocator(tmp_path, "up", "aggregate", run_id="manual:1+x", subtasks=[2],
                                 subpartitions=[1, 3]).check()
    assert not missing.ready
    assert "no subtasks [2]" in missing.message and "subpartitions [3]" in missing.message


def test_of_two_runs_with_one_date_the_committed_one_wins(tmp_path: Path) -> None:
    plan(tmp_path, "r_deleted_and_recreated", DAY)
    newer = plan(tmp_path, "r_recreated", DAY)
    commit(newer)
    observation = StageOutputLocator(tmp_path, "up", "aggregate", logical_date=DAY.isoformat()).check()
    assert observation.ready and observation.run_id == "r_recreated"


# -- trigger ---------------------------------------------------------------------------------


async def _first_event(trigger: StageOutputTrigger) -> Any:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")


def test_trigger_serialisation_round_trip() -> None:
    trigger = StageOutputTrigger("/s", "up", "aggregate", logical_date=DAY.isoformat(), subtasks=[1],
                                 subpartitions=[0], poke_interval=2.0, deadline=10.0)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (classpath, kwargs)


def test_trigger_fires_once_the_commit_appears(tmp_path: Path) -> None:
    layout = plan(tmp_path, "r1", DAY)
    checks: list[bool] = []

    class CountingLocator(StageOutputLocator):
        def check(self) -> Any:
            observation = super().check()
            checks.append(observation.ready)
            return observation

    trigger = StageOutputTrigger(str(tmp_path), "up", "aggregate", logical_date=DAY.isoformat(),
                                 poke_interval=0.01, deadline=time.time() + 60)
    trigger.locator = lambda: CountingLocator(tmp_path, "up", "aggregate", logical_date=DAY.isoformat())  # type: ignore[method-assign]

    async def scenario() -> Any:
        task = asyncio.ensure_future(_first_event(trigger))
        deadline = time.monotonic() + 30
        while len(checks) < 2:  # the trigger polled a store without the commit, and polls again
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.005)
        commit(layout)
        return await asyncio.wait_for(task, timeout=30)

    event = asyncio.run(scenario())
    assert event["status"] == "success" and event["run_id"] == "r1" and event["committed"] == str(layout.committed)
    assert checks[0] is False and checks[-1] is True


def test_trigger_times_out_naming_what_is_missing(tmp_path: Path) -> None:
    plan(tmp_path, "r1", DAY)
    trigger = StageOutputTrigger(str(tmp_path), "up", "aggregate", logical_date=DAY.isoformat(), subtasks=[0],
                                 poke_interval=0.01, deadline=time.time())
    event = asyncio.run(_first_event(trigger))
    assert event["status"] == "timeout"
    assert event["message"] == ("DAG 'up', stage 'aggregate', logical date 2026-01-01T00:00:00+00:00: stage not "
                                "committed yet; waiting for subtasks [0]")


def test_trigger_reports_a_broken_store_instead_of_dying(tmp_path: Path) -> None:
    layout = plan(tmp_path, "r1", DAY)
    layout.committed.write_text("{torn")
    event = asyncio.run(_first_event(StageOutputTrigger(str(tmp_path), "up", "aggregate", run_id="r1",
                                                        poke_interval=0.01, deadline=time.time() + 60)))
    assert event["status"] == "error" and "corrupt JSON" in event["message"]


# -- sensor ----------------------------------------------------------------------------------


def sensor(tmp_path: Path, **kwargs: Any) -> StageOutputSensor:
    """The sensor under test, deferrable unless a test says otherwise (the default is Airflow's setting)."""
    return StageOutputSensor(task_id="wait", external_dag_id="up", stage="aggregate", store_path=str(tmp_path),
                             **{"deferrable": True, **kwargs})


def test_reschedule_mode_reschedules_until_the_commit_then_returns_it(tmp_path: Path) -> None:
    op = sensor(tmp_path, deferrable=False, timeout=3600)
    assert op.mode == "reschedule"
    layout = plan(tmp_path, "r1", DAY)
    with pytest.raises(AirflowRescheduleException):
        op.execute(context())
    commit(layout)
    result = op.execute(context())
    assert result["run_id"] == "r1" and result["committed"] == str(layout.committed)


def test_reschedule_mode_timeout_names_what_is_missing_and_soft_fail_skips(tmp_path: Path) -> None:
    plan(tmp_path, "r1", DAY)
    long_ago = pendulum.now("UTC").subtract(hours=2)
    with pytest.raises(AirflowSensorTimeout, match=r"timed out after 60 s .*DAG 'up', stage 'aggregate', "
                                                   r"logical date 2026-01-01T00:00:00\+00:00: stage not committed"):
        sensor(tmp_path, deferrable=False, timeout=60).execute(context(first_reschedule=long_ago))
    with pytest.raises(AirflowSkipException, match="stage not committed yet"):
        sensor(tmp_path, deferrable=False, timeout=60, soft_fail=True).execute(context(first_reschedule=long_ago))


@pytest.mark.parametrize(("setting", "mode"), [(None, "reschedule"), ("True", "poke"), ("False", "reschedule")])
def test_unset_deferrable_follows_airflows_default_deferrable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              setting: str | None, mode: str) -> None:
    if setting is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    op = StageOutputSensor(task_id="wait", external_dag_id="up", stage="aggregate", store_path=str(tmp_path))
    assert (op.deferrable, op.mode) == (setting == "True", mode)


def test_deferrable_returns_at_once_when_already_committed(tmp_path: Path) -> None:
    commit(plan(tmp_path, "r1", DAY))
    assert sensor(tmp_path, deferrable=True).execute(context())["run_id"] == "r1"


def test_deferrable_defers_and_the_trigger_event_completes_it(tmp_path: Path) -> None:
    layout = plan(tmp_path, "r1", DAY)
    op = sensor(tmp_path, timeout=600, poke_interval=0.01, subtasks=[1], deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(logical_date=DAY.in_timezone("Europe/Paris")))
    trigger = deferred.value.trigger
    assert isinstance(trigger, StageOutputTrigger) and trigger.logical_date == "2026-01-01T00:00:00+00:00"
    assert deferred.value.timeout.total_seconds() > 600  # Airflow's own timeout is only a backstop
    commit(layout)
    event = asyncio.run(_first_event(trigger))
    assert op.execute_complete(context(), event)["committed"] == str(layout.committed)


def test_deferred_timeout_fails_naming_the_missing_output_or_skips_with_soft_fail(tmp_path: Path) -> None:
    plan(tmp_path, "r1", DAY)
    event = asyncio.run(_first_event(StageOutputTrigger(str(tmp_path), "up", "aggregate",
                                                        logical_date=DAY.isoformat(), subpartitions=[3],
                                                        poke_interval=0.01, deadline=time.time())))
    op = sensor(tmp_path, timeout=5)
    with pytest.raises(AirflowSensorTimeout, match=r"waiting for subpartitions \[3\]"):
        op.resume_execution("execute_complete", {"event": event}, context())
    with pytest.raises(AirflowSkipException):
        sensor(tmp_path, timeout=5, soft_fail=True).resume_execution("execute_complete", {"event": event},
                                                                     context())


def test_an_explicit_logical_date_overrides_the_runs_own(tmp_path: Path) -> None:
    commit(plan(tmp_path, "r0", DAY.subtract(days=1)))
    op = sensor(tmp_path, logical_date=DAY.subtract(days=1).isoformat())
    assert op.execute(context())["run_id"] == "r0"
    with pytest.raises(ValueError, match="not both"):
        sensor(tmp_path, logical_date="2026-01-01", run_id="r0")
