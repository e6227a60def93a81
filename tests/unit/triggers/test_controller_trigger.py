"""StageControllerTrigger: serialisation round trip, and run() against a stub controller."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.triggers import controller as trigger_module
from airflow_provider_speculative.triggers.controller import StageControllerTrigger


def test_serialize_round_trip_rebuilds_an_equal_trigger() -> None:
    trigger = StageControllerTrigger(plan_path="/store/d/r/scan/plan.json", deferred_at=123.5)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {"plan_path": "/store/d/r/scan/plan.json", "deferred_at": 123.5}


class StubController:
    """Decides after ``steps_to_done`` steps; records what the trigger asked of it."""

    instances: list[StubController] = []

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        self.plan, self.extra_env, self.target_env = plan, extra_env, target_env
        self.steps = 0
        self.config = type("Config", (), {"check_interval": 0.0})()
        StubController.instances.append(self)

    def step(self) -> list[Any]:
        self.steps += 1
        return []

    @property
    def done(self) -> bool:
        return self.steps >= 3

    def summary(self) -> dict[str, Any]:
        return {"numSlowExecutionVertices": 0, "numEffectiveSpeculativeExecutions": self.steps}

    def event_payload(self) -> dict[str, Any]:
        return {"status": "success", "plan_path": "p", "admitted": {"0": 0}, "summary": self.summary()}


async def _events(trigger: StageControllerTrigger) -> list[Any]:
    return [event async for event in trigger.run()]


def test_run_steps_until_decided_and_fires_exactly_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan_path = tmp_path / "plan.json"
    atomic_write_json(plan_path, {"dag_id": "d", "stage": "scan", "output": {"sink": None},
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
