"""Real spark-submit attempts driven by the controller: kill, on_kill, restart and double-run safety."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.faults import parse_faults
from airflow_provider_speculative.core.graph import PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.store.files import atomic_write_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.triggers.controller import StageControllerTrigger
from tests.integration.spark_helpers import group_processes, processes_mentioning, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

APP = Path(__file__).resolve().parents[2] / "dags" / "apps" / "q1_scan.py"
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
# Every attempt sleeps 5 minutes after writing (fault injection): only a kill can end it early.
SLEEP_AFTER_WRITE = {"targets": {"local-a": {"delay": "300s"}, "local-b": {"delay": "300s"}}}


def write_plan(tmp_path: Path, tpch_data: Path, config: dict) -> dict:
    """A two-subtask scan stage over two lineitem parts, written to the store like the operator does."""
    graph = PipelineGraph("t", {"scan": StageSpec("scan", str(APP), 2, {"lineitem": SourceSpec(str(tpch_data))})})
    files = [(str(p), p.stat().st_size) for p in sorted(tpch_data.glob("*.parquet"))[:2]]
    cfg = SpeculativeConfig().with_overrides({"check_interval": 0.5, **config}, "test")
    root = tmp_path / "store"
    command = [SPARK_SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.shuffle.partitions=4", str(APP)]
    plan = plan_stage(graph, "scan", cfg, source_files={"lineitem": files}, upstream_committed={}, sink=None,
                      speculation_blocker=None,
                      context={"dag_id": "t", "run_id": "r1", "store_root": str(root), "logical_date": None,
                               "application": str(APP),
                               "targets": {t.name: {"kind": "spark_submit", "conn_id": t.conn_id, "node": t.node_label,
                                                    "command": command, "env": {}} for t in cfg.targets}})
    atomic_write_json(StageLayout(root, "t", "r1", "scan").plan, plan)
    return plan


def running(controller: StageController) -> bool:
    controller.step()
    return all(a.state == AttemptState.RUNNING for a in controller.scheduler.all_attempts()) and \
        len(controller.scheduler.all_attempts()) == 2


def test_cancel_and_on_kill_leave_no_spark_driver(tmp_path, tpch_data):
    plan = write_plan(tmp_path, tpch_data, {})
    controller = StageController.open(plan, faults=parse_faults(SLEEP_AFTER_WRITE))
    wait_for(lambda: running(controller), 180, "both attempts RUNNING")
    layout = controller.layout
    pgids = {s: read_json(layout.status(s, 0))["pgid"] for s in (0, 1)}
    assert all(group_processes(pgid) for pgid in pgids.values())

    backend = controller.backends["local-a"]
    backend.cancel(0, 0, "test")
    wait_for(lambda: backend.reap(0, 0), 30, "attempt 0 of subtask 0 to die")
    assert group_processes(pgids[0]) == []
    assert wait_for(lambda: backend.poll(0, 0).state == AttemptState.CANCELED, 10, "CANCELED state")

    # The user marks the deferred task failed: the trigger's on_kill stops the rest.
    trigger = StageControllerTrigger(plan_path=str(layout.plan), deferred_at=time.time())
    asyncio.run(trigger.on_kill())
    assert group_processes(pgids[1]) == []
    assert processes_mentioning(str(layout.dir)) == []
    assert any(e["event"] == "killed_all" and e["left"] == [] for e in read_jsonl(layout.journal))


async def _both_running(layout: StageLayout, timeout: float = 180) -> dict[int, int]:
    """The process group of each subtask's first attempt, once both are running (polled with a deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {s: (read_json(layout.status(s, 0)) or {}).get("pgid") for s in (0, 1)}
        if all(found.values()) and all(group_processes(pgid) for pgid in found.values()):
            return found
        await asyncio.sleep(0.5)
    raise AssertionError(f"both attempts did not start within {timeout}s: {found}")


@pytest.mark.parametrize("how", ["seen_by_the_trigger", "cancelled_by_airflow"])
def test_an_execution_timeout_stops_every_attempt(tmp_path, tpch_data, how):
    # Airflow cancels a timed-out trigger without calling on_kill: the trigger stops the attempts itself,
    # whether its own loop sees the deadline first or Airflow's cancellation comes first (cleanup()).
    plan = write_plan(tmp_path, tpch_data, {})
    layout = StageLayout(Path(plan["store_root"]), "t", "r1", "scan")
    trigger = StageControllerTrigger(plan_path=str(layout.plan), deferred_at=time.time())
    trigger.timeout_after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)

    async def scenario() -> tuple[dict[int, int], Any]:
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        pgids = await _both_running(layout)
        assert not first.done(), "the stage ended before its deadline"
        trigger.timeout_after = datetime.datetime.now(datetime.UTC)
        if how == "cancelled_by_airflow":
            first.cancel()  # as the triggerer does at the deadline, then it calls cleanup()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            await trigger.cleanup()
            return pgids, None
        return pgids, await asyncio.wait_for(first, 120)

    with injected({"t/scan": SLEEP_AFTER_WRITE}):  # the trigger builds its controller in this process
        pgids, event = asyncio.run(scenario())
    assert all(group_processes(pgid) == [] for pgid in pgids.values()), "an attempt outlived the timeout"
    assert processes_mentioning(str(layout.dir)) == []
    assert any(e["event"] == "killed_all" and e["reason"] == "execution_timeout" and e["left"] == []
               for e in read_jsonl(layout.journal))
    state = read_json(layout.task_state)
    assert state["state"] == "failed" and "execution_timeout passed" in state["reason"], state
    if event is not None:
        assert event.payload["status"] == "timed_out"
        assert event.payload["reason"].startswith("pipeline 't', stage 'scan': the task's execution_timeout")


def test_restarted_and_doubled_controllers_launch_no_duplicates(tmp_path, tpch_data):
    plan = write_plan(tmp_path, tpch_data, {})
    first, twin = StageController.open(plan), StageController.open(plan)  # an HA double-run: both start empty
    first.step()
    twin.step()  # its launches lose the atomic claims and adopt the running attempts
    del first  # the triggerer restarts: a new controller rebuilds from the store
    restarted = StageController.open(plan)
    assert {(a.subtask, a.number) for a in restarted.scheduler.all_attempts()} == {(0, 0), (1, 0)}

    def both_done() -> bool:
        restarted.step()
        twin.step()
        return restarted.done and twin.done

    wait_for(both_done, 240, "the stage to complete in both controllers")
    layout = restarted.layout
    assert [layout.attempt_numbers(s) for s in (0, 1)] == [[0], [0]]
    launches = [e for e in read_jsonl(layout.journal) if e["event"] == "launch"]
    assert sorted((e["subtask"], e["attempt"]) for e in launches) == [(0, 0), (1, 0)]
    assert sum(e["event"] == "claim_lost" for e in read_jsonl(layout.journal)) == 2
    assert restarted.event_payload()["admitted"] == twin.event_payload()["admitted"] == {"0": 0, "1": 0}

    # A trigger rebuilt from its serialized kwargs reconnects to the finished stage and fires at once.
    classpath, kwargs = StageControllerTrigger(plan_path=str(layout.plan), deferred_at=time.time() - 60).serialize()
    assert classpath.endswith("StageControllerTrigger")

    async def first_event() -> dict:
        async for event in StageControllerTrigger(**kwargs).run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    assert asyncio.run(first_event())["admitted"] == {"0": 0, "1": 0}
    assert [layout.attempt_numbers(s) for s in (0, 1)] == [[0], [0]]
