"""Slots belong to the target: three stage controllers of one run share a target's slots through the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.store.files import read_jsonl
from airflow_provider_speculative.store.slots import TargetSlots
from tests.factories import Clock, stage_plan, write_plan
from tests.unit.control.test_controller import FakeBackend


def stage(root: Path, name: str, clock: Clock, parallelism: int = 4,
          **config: Any) -> tuple[StageController, FakeBackend]:
    plan = stage_plan(root, stage=name, parallelism=parallelism,
                      config={"targets": [{"name": "host", "slots": 2}], **config})
    layout = write_plan(plan)
    backend = FakeBackend(layout, clock)
    return StageController.open(plan, clock=clock, backends={"host": backend}, observer=backend), backend


def live(backends: list[FakeBackend]) -> int:
    return sum(a.state.value == "RUNNING" for b in backends for a in b.attempts.values())


def test_three_source_stages_never_exceed_the_targets_slots(tmp_path):
    clock = Clock()
    stages = [stage(tmp_path, f"scan{i}", clock) for i in range(3)]
    backends = [b for _, b in stages]
    for controller, _ in stages:
        controller.step()
    # 12 subtasks want to run, the target has 2 slots: 2 attempts in all, not 2 per stage.
    assert live(backends) == 2 and TargetSlots(tmp_path, "host").count() == 2
    assert "waiting for a free slot" in stages[2][0].summary(clock())["slot_status"]
    finished = 0
    for _ in range(40):
        clock.now += 1
        for backend in backends:
            for (sub, number), attempt in list(backend.attempts.items()):
                if attempt.state.value == "RUNNING":
                    backend.finish(sub, number)
                    finished += 1
                    break
        for controller, _ in stages:
            controller.step()
            assert live(backends) <= 2
        if all(c.done for c, _ in stages):
            break
    assert all(c.done for c, _ in stages) and finished == 12
    # Every slot was released by its holder when its attempt ended.
    assert TargetSlots(tmp_path, "host").count() == 0
    launches = [e for c, _ in stages for e in read_jsonl(c.layout.journal) if e["event"] == "launch"]
    assert len(launches) == 12 and {e["slot"] for e in launches} == {0, 1}


def test_a_restarted_controller_keeps_and_later_releases_its_slots(tmp_path):
    clock = Clock()
    controller, backend = stage(tmp_path, "scan", clock, parallelism=1)
    controller.step()
    assert TargetSlots(tmp_path, "host").count() == 1
    again = StageController.open(controller.plan, clock=clock, backends={"host": backend}, observer=backend)
    assert list(again.held) == [(0, 0)]
    backend.finish(0, 0)
    clock.now += 1
    again.step()
    assert TargetSlots(tmp_path, "host").count() == 0


def test_a_failed_stage_gives_back_the_slots_of_its_cancelled_attempts(tmp_path):
    clock = Clock()
    controller, backend = stage(tmp_path, "scan", clock, parallelism=2, max_failures_per_stage=0)
    controller.step()
    assert TargetSlots(tmp_path, "host").count() == 2
    backend.set(0, 0, AttemptState.FAILED)
    clock.now += 1
    controller.step()
    assert controller.result is not None and (1, 0) in backend.cancelled
    clock.now += 1
    controller.step()
    assert controller.done and TargetSlots(tmp_path, "host").count() == 0


def test_kill_all_gives_back_the_slots(tmp_path):
    clock = Clock()
    controller, _ = stage(tmp_path, "scan", clock, parallelism=2)
    controller.step()
    controller.kill_all("test")
    assert TargetSlots(tmp_path, "host").count() == 0


def test_attempts_that_ran_beside_another_stages_are_not_timed_for_speed(tmp_path):
    # Two stages share the host's two slots: each stage's attempt ran beside the other stage's, so
    # neither tells the host's speed (core/speed.py); an attempt alone on it does.
    clock = Clock()
    (first, first_backend), (second, second_backend) = (stage(tmp_path, f"scan{i}", clock, parallelism=1)
                                                        for i in range(2))
    first.step()
    second.step()
    assert live([first_backend, second_backend]) == 2
    clock.now += 1
    first.step()
    second.step()
    assert all(a.shared for per in first.scheduler.attempts.values() for a in per.values())
    assert all(a.shared for per in second.scheduler.attempts.values() for a in per.values())
    alone, _ = stage(tmp_path, "scan_alone", clock, parallelism=1)
    for controller, backend in ((first, first_backend), (second, second_backend)):
        for key, attempt in list(backend.attempts.items()):
            if attempt.state.value == "RUNNING":
                backend.finish(*key)
        clock.now += 1
        controller.step()
    clock.now += 1
    alone.step()
    assert not any(a.shared for per in alone.scheduler.attempts.values() for a in per.values())
