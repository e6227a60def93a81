"""The controller seeds placement from the store's target speed records and keeps what a completed run measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_speculative.cli.commands import slot_lines
from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.speeds import record_speeds, speed_path
from tests.unit.control.test_controller import harness


def test_history_from_an_earlier_run_steers_the_first_wave_and_is_shown(tmp_path: Path) -> None:
    record_speeds(tmp_path / "store", {"local-a": 1.0, "local-b": 4.0}, now=999.0, where="d/r0/scan")
    h = harness(tmp_path, parallelism=8)
    h.step()
    targets = [(spec.subtask, spec.target) for spec in h.backend.launched]
    # local-a's four slots first, one probe on local-b, the other three wait for local-a.
    assert targets == [(0, "local-a"), (1, "local-a"), (2, "local-a"), (3, "local-a"), (4, "local-b")]
    summary = h.controller.summary()
    assert summary["target_speeds"]["local-b"] == {"slowness": 4.0, "source": "history"}
    assert summary["held_subtasks"] == 3
    stage = run_report(tmp_path / "store", "d", "r")["stages"][0]
    assert stage["speed_line"].startswith("slow targets: local-b 4.0x (history); 3 original attempt(s) waiting")
    assert stage["speed_line"] in slot_lines(stage)


def test_a_completed_run_records_each_targets_slowness_for_the_next(tmp_path: Path) -> None:
    h = harness(tmp_path, parallelism=2)
    plan = h.controller.plan
    for sub in plan["subtasks"]:
        sub["input_bytes"] = 100
    h.controller.scheduler.input_bytes.update({0: 100, 1: 100})
    h.step()
    assert [(s.subtask, s.target) for s in h.backend.launched] == [(0, "local-a"), (1, "local-b")]
    h.clock.now += 1.0
    h.backend.finish(0, 0)
    h.step(0.0)
    h.clock.now += 3.0
    h.backend.finish(1, 0)
    for _ in range(100):  # fake clock: the stage completes within a few steps, or the test fails below
        if h.controller.done:
            break
        h.step(0.1)
    assert h.controller.done
    assert read_json(speed_path(tmp_path / "store", "local-a"))["slowness"] == 1.0
    record = read_json(speed_path(tmp_path / "store", "local-b"))
    assert record["slowness"] == pytest.approx(4.0, rel=0.05) and record["from"] == "d/r/scan"


def test_of_two_stages_of_a_run_only_one_sends_the_probe(tmp_path: Path) -> None:
    from airflow_provider_speculative.control.controller import StageController
    from tests.factories import Clock, stage_plan, write_plan
    from tests.unit.control.test_controller import FakeBackend

    record_speeds(tmp_path / "store", {"local-a": 1.0, "local-b": 4.0}, now=999.0, where="d/r0/scan")
    h = harness(tmp_path, parallelism=8)
    assert h.controller.scheduler.probe_targets == {"local-b"}
    plan = stage_plan(tmp_path / "store", stage="other", parallelism=8)
    layout = write_plan(plan)
    clock = Clock()
    backend = FakeBackend(layout, clock)
    other = StageController.open(plan, clock=clock, backends={"local-a": backend, "local-b": backend}, observer=backend)
    assert other.scheduler.probe_targets == frozenset()
