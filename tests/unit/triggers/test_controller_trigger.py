"""StageControllerTrigger: serialisation round trip, and run() against a stub controller."""

from __future__ import annotations

import asyncio
import importlib
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.triggers.base import TaskSuccessEvent

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.faults import NO_FAULTS, FaultInjection
from airflow_provider_speculative.core.plan import PLAN_VERSION
from airflow_provider_speculative.store.files import atomic_write_json, read_json
from airflow_provider_speculative.store.journal import read as read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
from airflow_provider_speculative.triggers import controller as trigger_module
from airflow_provider_speculative.triggers.controller import StageControllerTrigger


def test_serialize_round_trip_rebuilds_an_equal_trigger() -> None:
    trigger = StageControllerTrigger(plan_path="/store/d/r/scan/plan.json", deferred_at=123.5)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {"plan_path": "/store/d/r/scan/plan.json", "deferred_at": 123.5, "commit": None}
    committing = StageControllerTrigger(plan_path="p", deferred_at=1.0, commit={"try_number": 2, "clear_number": 1})
    assert committing.serialize()[1]["commit"] == {"try_number": 2, "clear_number": 1}


class StubController:
    """Decides after ``steps_to_done`` steps; records what the trigger asked of it."""

    instances: list[StubController] = []

    @classmethod
    def open(cls, plan: dict[str, Any], **kwargs: Any) -> StubController:
        return cls(plan, **kwargs)

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        self.plan, self.extra_env, self.target_env = plan, extra_env, target_env
        self.steps = 0
        self.config = SpeculativeConfig(check_interval=0.0, driver_log_lines=0)  # a stub has no attempts to tail
        StubController.instances.append(self)

    def step(self) -> list[Any]:
        self.steps += 1
        return []

    def wake_after(self) -> float:
        return 0.0

    def changed(self) -> bool:
        return False

    @property
    def done(self) -> bool:
        return self.steps >= 3

    def summary(self) -> dict[str, Any]:
        return {"numSlowExecutionVertices": 0, "numEffectiveSpeculativeExecutions": self.steps}

    def attempt_lines(self) -> list[str]:
        return ["attempts of stage (stub)"]

    def event_payload(self) -> dict[str, Any]:
        return {"status": "success", "plan_path": "p", "admitted": {"0": 0}, "summary": self.summary()}


async def _events(trigger: StageControllerTrigger) -> list[Any]:
    return [event async for event in trigger.run()]


def test_run_steps_until_decided_and_fires_exactly_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan_path = tmp_path / "plan.json"
    atomic_write_json(plan_path, {"version": PLAN_VERSION, "dag_id": "d", "run_id": "r", "stage": "scan",
                                  "store_root": str(tmp_path), "parallelism": 1, "subtasks": [{}], "config": {},
                                  "fingerprint": "f1", "output": {"sink": None},
                                  "targets": {"local-a": {"kind": "spark_submit"}}})
    monkeypatch.setattr(trigger_module, "StageController", StubController)
    monkeypatch.setattr(trigger_module, "min_seconds_before_event", lambda: 0.0)
    emitted: list[dict[str, Any]] = []
    monkeypatch.setattr(trigger_module.StageMetrics, "emit", lambda self, summary, **kw: emitted.append(summary))
    StubController.instances.clear()

    events = asyncio.run(_events(StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0)))

    (stub,) = StubController.instances
    assert stub.steps == 3 and len(events) == 1
    assert events[0].payload == {"status": "success", "plan_path": "p", "admitted": {"0": 0},
                                 "summary": {"numSlowExecutionVertices": 0, "numEffectiveSpeculativeExecutions": 3}}
    assert [e["numEffectiveSpeculativeExecutions"] for e in emitted] == [1, 2, 3]
    assert stub.extra_env == {} and stub.target_env == {}  # no sink, no Connect target: nothing resolved


def test_a_missing_plan_fails_the_trigger_naming_it(tmp_path: Path) -> None:
    trigger = StageControllerTrigger(plan_path=str(tmp_path / "gone.json"), deferred_at=0.0)
    with pytest.raises(FileNotFoundError, match=r"gone\.json"):
        asyncio.run(_events(trigger))


class DecidedController:
    """A controller whose stage is decided at once: subtask 0 admitted attempt 1 (attempt 0 lost)."""

    @classmethod
    def open(cls, plan: dict[str, Any], **kwargs: Any) -> DecidedController:
        return cls(plan, **kwargs)

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        self.plan = plan
        self.layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
        self.config = SpeculativeConfig(check_interval=0.0, driver_log_lines=0)  # a stub has no attempts to tail
        self.faults = NO_FAULTS
        self.done = self.succeeded = True

    def step(self) -> list[Any]:
        return []

    def summary(self) -> dict[str, Any]:
        return {"numSlowExecutionVertices": 1, "numEffectiveSpeculativeExecutions": 1}

    def attempt_lines(self) -> list[str]:
        return ["attempts of stage (stub)"]

    def event_payload(self) -> dict[str, Any]:
        return {"status": "success", "plan_path": str(self.layout.plan), "admitted": {"0": 1},
                "summary": self.summary()}


def _decided_stage(tmp_path: Path) -> tuple[StageLayout, Path]:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    plan = {"version": PLAN_VERSION, "dag_id": "d", "run_id": "r", "stage": "scan",
            "store_root": str(tmp_path / "store"), "parallelism": 1, "subtasks": [{}], "config": {},
            "fingerprint": "f1", "output": {"sink": None}, "targets": {"local-a": {"kind": "spark_submit"}}}
    layout.claim_run()
    atomic_write_json(layout.plan, plan)
    for attempt in (0, 1):
        data = layout.data(0, attempt)
        data.mkdir(parents=True)
        (data / "part-0.parquet").write_bytes(b"rows of attempt %d" % attempt)
        write_manifest(layout.manifest(0, attempt), build_manifest(data, schema=None, records=1))
    return layout, layout.plan


def test_a_committing_trigger_commits_and_ends_the_task_in_the_triggerer(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    layout, plan_path = _decided_stage(tmp_path)
    monkeypatch.setattr(trigger_module, "StageController", DecidedController)
    monkeypatch.setattr(trigger_module, "runs_in_line", lambda: False)
    monkeypatch.setattr(trigger_module, "min_seconds_before_event", lambda: 3600.0)  # not waited for: ends here

    trigger = StageControllerTrigger(plan_path=str(plan_path), deferred_at=time.time(),
                                     commit={"try_number": 2, "clear_number": 1})
    (event,) = asyncio.run(_events(trigger))

    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms["return_value"]["committed"] == str(layout.committed)
    committed = read_json(layout.committed)
    assert committed["fingerprint"] == "f1" and committed["subtasks"]["0"]["attempt"] == 1
    assert read_json(layout.dir / "task.json")["state"] == "committed"
    assert read_json(layout.dir / "task.json")["try_number"] == 2
    assert not layout.manifest(0, 0).exists() and layout.manifest(0, 1).exists()  # the loser's output is gone
    assert [e["by"] for e in read_jsonl(layout.journal) if e["event"] == "finalize_done"] == ["triggerer"]


def test_without_the_commit_right_or_in_line_the_worker_commits(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    layout, plan_path = _decided_stage(tmp_path)
    monkeypatch.setattr(trigger_module, "StageController", DecidedController)
    monkeypatch.setattr(trigger_module, "min_seconds_before_event", lambda: 0.0)
    for in_line, commit in ((False, None), (True, {"try_number": 1, "clear_number": 0})):
        monkeypatch.setattr(trigger_module, "runs_in_line", lambda in_line=in_line: in_line)
        (event,) = asyncio.run(_events(StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0,
                                                              commit=commit)))
        assert not isinstance(event, TaskSuccessEvent) and event.payload["status"] == "success"
    assert not layout.committed.exists() and layout.manifest(0, 0).exists()


class FailedController(DecidedController):
    """A stage decided as failed: its failure must reach the worker, never a trigger-side commit."""

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        super().__init__(plan, extra_env=extra_env, target_env=target_env)
        self.succeeded = False

    def event_payload(self) -> dict[str, Any]:
        return {"status": "failed", "plan_path": str(self.layout.plan), "reason": "too many failures",
                "summary": self.summary()}


def test_a_failed_stage_resumes_the_worker_even_with_the_commit_right(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    layout, plan_path = _decided_stage(tmp_path)
    monkeypatch.setattr(trigger_module, "StageController", FailedController)
    monkeypatch.setattr(trigger_module, "runs_in_line", lambda: False)
    monkeypatch.setattr(trigger_module, "min_seconds_before_event", lambda: 0.0)
    (event,) = asyncio.run(_events(StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0,
                                                          commit={"try_number": 1, "clear_number": 0})))
    assert not isinstance(event, TaskSuccessEvent) and event.payload["status"] == "failed"
    assert not layout.committed.exists()


class HoldingController(DecidedController):
    """A decided controller whose stage has fault injection ``hold_commit`` (the hook's answer for it)."""

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        super().__init__(plan, extra_env=extra_env, target_env=target_env)
        self.config = SpeculativeConfig().with_overrides({"driver_log_lines": 0}, "test")
        self.faults = FaultInjection(hold_commit=True)


def test_hold_commit_holds_the_event_after_the_commit_until_released(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    layout, plan_path = _decided_stage(tmp_path)
    monkeypatch.setattr(trigger_module, "StageController", HoldingController)
    monkeypatch.setattr(trigger_module, "runs_in_line", lambda: False)
    trigger = StageControllerTrigger(plan_path=str(plan_path), deferred_at=time.time(),
                                     commit={"try_number": 1, "clear_number": 0})
    events: list[Any] = []
    runner = threading.Thread(target=lambda: events.extend(asyncio.run(_events(trigger))), daemon=True)
    runner.start()
    held, release = layout.commit_hold()
    deadline = time.monotonic() + 30
    while not held.exists():
        assert time.monotonic() < deadline, "the trigger never held after its commit"
        time.sleep(0.02)
    # Committed, and the task not ended yet: where a test kills the triggerer.
    assert read_json(layout.committed)["subtasks"]["0"]["attempt"] == 1
    assert read_json(held)["pid"] > 0 and runner.is_alive() and not events
    release.touch()
    runner.join(timeout=30)
    assert [type(e) for e in events] == [TaskSuccessEvent]


def test_a_plan_of_another_version_fails_the_trigger_naming_the_plan(tmp_path: Path) -> None:
    from airflow_provider_speculative.exceptions import PlanError

    plan_path = tmp_path / "plan.json"
    atomic_write_json(plan_path, {"version": PLAN_VERSION + 1, "stage": "scan"})
    with pytest.raises(PlanError, match=rf"stage plan {plan_path}: plan version {PLAN_VERSION + 1}.*newer provider"):
        asyncio.run(_events(StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0)))


def test_on_kill_stops_the_attempts_from_the_store_without_a_controller(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    layout, plan_path = _decided_stage(tmp_path)
    kills: list[tuple[str, str]] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("on_kill builds no controller")

    monkeypatch.setattr(trigger_module, "StageController", refuse)
    monkeypatch.setattr(trigger_module, "kill_stage", lambda plan, reason, **kw: kills.append((plan["stage"], reason)))
    asyncio.run(StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0).on_kill())
    assert kills == [("scan", "task killed by user")]
    # Marked success or failed: the trigger cannot tell, so the state claims neither.
    state = read_json(layout.task_state)
    assert state["state"] == "killed" and "marked success or failed" in state["reason"], state


def test_a_timeout_before_the_controller_is_open_stops_the_attempts_from_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    layout, plan_path = _decided_stage(tmp_path)
    kills: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(trigger_module, "kill_stage", lambda plan, reason, **kw: kills.append((reason, kw)))
    trigger = StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0)
    trigger.timeout_after = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    # run() read the plan and resolved the attempts' secrets; its controller was still opening when cancelled.
    trigger._running = (trigger._plan(), {"SINK_DSN": "secret"}, {"local-a": {"R": "sc://a"}})
    asyncio.run(trigger.cleanup())
    assert kills == [("execution_timeout", {"extra_env": {"SINK_DSN": "secret"},
                                            "target_env": {"local-a": {"R": "sc://a"}}})]
    state = read_json(layout.task_state)
    assert state["state"] == "failed" and "execution_timeout passed" in state["reason"]


class TailedController:
    """One attempt that writes a driver log line per step and ends at the third, leaving a last line unended."""

    @classmethod
    def open(cls, plan: dict[str, Any], **kwargs: Any) -> TailedController:
        return cls(plan, **kwargs)

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        from types import SimpleNamespace

        from airflow_provider_speculative.core.states import Attempt, AttemptState

        self.plan = plan
        self.layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
        self.config = SpeculativeConfig(check_interval=0.0, driver_log_lines=5)
        self.attempt = Attempt(0, 0, "local-a", AttemptState.RUNNING, created_at=time.time())
        self.scheduler = SimpleNamespace(all_attempts=lambda: [self.attempt])
        self.steps = 0
        self.done = self.succeeded = False

    def step(self) -> list[Any]:
        from dataclasses import replace

        from airflow_provider_speculative.core.states import AttemptState

        self.steps += 1
        self.layout.log(0, 0).parent.mkdir(parents=True, exist_ok=True)
        with open(self.layout.log(0, 0), "a") as log:
            log.write(f"driver line {self.steps}\n")
            if self.steps == 3:
                log.write("\x1b[2Jlast words")
        if self.steps == 3:
            self.attempt = replace(self.attempt, state=AttemptState.FAILED, end_at=time.time())
            self.done = True
        return []

    def wake_after(self) -> float:
        return 0.0

    def changed(self) -> bool:
        return False

    def summary(self) -> dict[str, Any]:
        return {}

    def attempt_lines(self) -> list[str]:
        return ["attempts of stage (stub)"]

    def event_payload(self) -> dict[str, Any]:
        return {"status": "failed", "plan_path": str(self.layout.plan), "reason": "r", "summary": {}}


def test_the_attempts_driver_logs_reach_the_trigger_log_as_the_stage_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    _, plan_path = _decided_stage(tmp_path)
    monkeypatch.setattr(trigger_module, "StageController", TailedController)
    monkeypatch.setattr(trigger_module, "min_seconds_before_event", lambda: 0.0)
    monkeypatch.setattr(trigger_module.StageMetrics, "emit", lambda self, summary, **kw: None)
    trigger = StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0)
    # Airflow's structlog set-up does not reach caplog: the trigger logs through a standard logger here.
    trigger._log = logging.getLogger("speculative.test.trigger")  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="speculative.test.trigger"):
        (event,) = asyncio.run(_events(trigger))
    assert event.payload["status"] == "failed"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("subtask 0 attempt 0")]
    assert lines == [f"subtask 0 attempt 0 (target local-a): driver line {i}" for i in (1, 2, 3)] + [
        "subtask 0 attempt 0 (target local-a): \\x1b[2Jlast words"]
    # One record per line, before the summary of every attempt.
    messages = [r.getMessage() for r in caplog.records]
    assert messages.index("attempts of stage (stub)") > messages.index(lines[-1])


def test_a_trigger_that_ends_the_task_pushes_the_application_ids(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    layout, plan_path = _decided_stage(tmp_path)
    for attempt, app_id in ((0, "local-17"), (1, "local-18")):
        atomic_write_json(layout.heartbeat(0, attempt), {"node": "local-a", "app_id": app_id})
    atomic_write_json(layout.admitted(0), {"attempt": 1, "at": 1.0})
    monkeypatch.setattr(trigger_module, "StageController", DecidedController)
    monkeypatch.setattr(trigger_module, "runs_in_line", lambda: False)
    trigger = StageControllerTrigger(plan_path=str(plan_path), deferred_at=time.time(),
                                     commit={"try_number": 1, "clear_number": 0})
    (event,) = asyncio.run(_events(trigger))
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms["spark_app_ids"] == {"0": ["local-17", "local-18"]}
    assert event.xcoms["spark_admitted_app_ids"] == {"0": "local-18"}


def test_on_kill_reaches_connect_targets_with_their_connections_secrets(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, plan_path = _decided_stage(tmp_path)
    kills: list[dict[str, Any]] = []
    monkeypatch.setattr(trigger_module, "kill_stage", lambda plan, reason, **kw: kills.append(kw))

    async def resolved(plan: Any) -> dict[str, dict[str, str]]:
        return {"local-a": {"R": "sc://a/;token=t"}}

    monkeypatch.setattr(trigger_module, "connect_env", resolved)
    trigger = StageControllerTrigger(plan_path=str(plan_path), deferred_at=0.0)
    asyncio.run(trigger.on_kill())
    assert kills[-1]["target_env"] == {"local-a": {"R": "sc://a/;token=t"}}  # not the recorded URL without token

    async def missing(plan: Any) -> dict[str, dict[str, str]]:
        raise LookupError("connection 'sc' not found")

    monkeypatch.setattr(trigger_module, "connect_env", missing)
    asyncio.run(trigger.on_kill())  # a connection that cannot be read does not stop the kill
    assert kills[-1]["target_env"] == {} and len(kills) == 2
    trigger._running = (trigger._plan(), {"SINK_DSN": "secret"}, {"local-a": {"R": "sc://run"}})
    asyncio.run(trigger.on_kill())  # a running trigger's own secrets first
    assert kills[-1] == {"extra_env": {"SINK_DSN": "secret"}, "target_env": {"local-a": {"R": "sc://run"}}}
