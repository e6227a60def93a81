"""Constructing a StageController reads nothing; open() does the I/O; kill_stage stops attempts from the store alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control import controller as controller_module
from airflow_provider_speculative.control import speedcheck
from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.control.kill import kill_stage
from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.slots import TargetSlots, holder_record
from airflow_provider_speculative.store.speeds import record_speeds
from tests.factories import Clock, stage_plan, write_plan
from tests.unit.control.test_controller import FakeBackend

URLS = {"local-a": "sc://a:15002/", "local-b": "sc://b:15002/"}
S = AttemptState


def connect_plan(root: Path, parallelism: int = 2) -> dict[str, Any]:
    """A plan on two Spark Connect targets: a controller opened on it wants a speed check when history is empty."""
    plan = stage_plan(root, parallelism=parallelism)
    for spec in plan["targets"].values():
        spec["kind"] = "spark_connect"
    return plan


class Checks:
    """A fake speed check that records which servers it was asked to time."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, url: str) -> float:
        self.calls.append(url)
        return 0.01


def test_constructing_a_controller_reads_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "missing-store"
    plan = connect_plan(root)
    layout = StageLayout.of_plan(plan)
    backend = FakeBackend(layout, Clock())
    checks = Checks()
    controller = StageController(plan, clock=Clock(), backends={"local-a": backend, "local-b": backend},
                                 observer=backend, target_env={n: {REMOTE_ENV: u} for n, u in URLS.items()},
                                 speed_check=checks)
    assert not root.exists()  # no speed records read or check claimed, no probe, no journal line
    assert checks.calls == []
    assert controller.scheduler.all_attempts() == [] and controller.reaping == set()


def test_open_checks_the_speeds_claims_the_probe_and_restores(tmp_path: Path) -> None:
    root = tmp_path / "store"
    plan = connect_plan(root)
    layout = write_plan(plan)
    clock = Clock()
    backend = FakeBackend(layout, clock)
    assert create_exclusive_json(layout.claim(0, 0), {"target": "local-a", "created_at": clock()})
    backend.attempts[(0, 0)] = Attempt(0, 0, "local-a", S.RUNNING, deploying_at=clock())
    checks = Checks()
    kwargs: dict[str, Any] = {"clock": clock, "backends": {"local-a": backend, "local-b": backend},
                              "observer": backend, "target_env": {n: {REMOTE_ENV: u} for n, u in URLS.items()},
                              "speed_check": checks}
    built = StageController(plan, **kwargs)
    assert checks.calls == [] and built.scheduler.all_attempts() == []
    opened = StageController.open(plan, **kwargs)
    assert sorted(checks.calls) == sorted(URLS.values())
    events = [e["event"] for e in read_jsonl(layout.journal)]
    assert events == ["speed_check", "restored"]
    assert [(a.subtask, a.number, a.state) for a in opened.scheduler.all_attempts()] == [(0, 0, S.RUNNING)]


def test_only_open_claims_the_runs_probe_of_a_target_history_calls_slow(tmp_path: Path) -> None:
    root = tmp_path / "store"
    record_speeds(root, {"local-a": 1.0, "local-b": 4.0}, now=999.0, where="d/r0/scan")
    plan = stage_plan(root, parallelism=2)
    layout = write_plan(plan)
    backend = FakeBackend(layout, Clock())
    kwargs: dict[str, Any] = {"clock": Clock(), "backends": {"local-a": backend, "local-b": backend},
                              "observer": backend}
    assert StageController(plan, **kwargs).scheduler.probe_targets == frozenset()
    assert not (root / "_targets" / "local-b" / "probes").exists()
    assert StageController.open(plan, **kwargs).scheduler.probe_targets == {"local-b"}
    assert list((root / "_targets" / "local-b" / "probes").iterdir())


@pytest.fixture
def no_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything builds a scheduler or controller, or runs a speed check."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("kill_stage must stop attempts from the store alone")

    monkeypatch.setattr(controller_module, "StageScheduler", refuse)
    monkeypatch.setattr(controller_module, "check_speeds", refuse)
    monkeypatch.setattr(speedcheck, "check_speeds", refuse)
    monkeypatch.setattr(StageController, "__init__", refuse)


def test_kill_stage_stops_the_live_attempts_of_a_stage_from_the_store(tmp_path: Path, no_controller: None) -> None:
    root = tmp_path / "store"
    # History calls local-b slow and no check ran: an opened controller would claim a probe and time the servers.
    record_speeds(root, {"local-a": 1.0, "local-b": 4.0}, now=999.0, where="d/r0/scan")
    plan = connect_plan(root)
    layout = write_plan(plan)
    clock = Clock()
    backend = FakeBackend(layout, clock)
    attempts = {(0, 0): ("local-a", S.FINISHED), (1, 0): ("local-b", S.RUNNING), (1, 1): ("local-a", S.RUNNING)}
    slots = {name: TargetSlots(root, name) for name in URLS}
    for (subtask, number), (target, state) in attempts.items():
        assert create_exclusive_json(layout.claim(subtask, number), {"target": target, "created_at": clock()})
        backend.attempts[(subtask, number)] = Attempt(subtask, number, target, state, deploying_at=clock())
        atomic_write_json(layout.manifest(subtask, number), {"files": [], "records": 0})
        assert slots[target].claim(4, holder_record(layout, subtask, number, clock())) is not None
    atomic_write_json(layout.admitted(0), {"attempt": 0, "at": clock()})

    left = kill_stage(plan, "task killed by user", backends={"local-a": backend, "local-b": backend},
                      observer=backend, target_env={n: {REMOTE_ENV: u} for n, u in URLS.items()}, clock=clock)

    assert left == []
    assert sorted(backend.cancelled) == [(1, 0), (1, 1)]  # the finished one is left alone
    assert layout.manifest(0, 0).exists()  # the admitted output stays
    assert not layout.manifest(1, 0).exists() and not layout.manifest(1, 1).exists()
    assert all(s.count() == 0 for s in slots.values())  # every slot of the stage's gone attempts given back
    events = read_jsonl(layout.journal)
    assert [e["event"] for e in events] == ["restored", "killed_all"]
    assert events[0]["attempts"] == 3 and events[0]["admitted"] == {"0": 0}
    assert events[1]["reason"] == "task killed by user" and events[1]["left"] == []
    assert not (root / "_targets" / "local-b" / "probes").exists()


def test_kill_stage_reports_an_attempt_that_outlives_its_cancel(tmp_path: Path, no_controller: None) -> None:
    plan = stage_plan(tmp_path / "store", parallelism=1)
    layout = write_plan(plan)
    clock = Clock()
    backend = FakeBackend(layout, clock)
    assert create_exclusive_json(layout.claim(0, 0), {"target": "local-a", "created_at": clock()})
    backend.attempts[(0, 0)] = Attempt(0, 0, "local-a", S.RUNNING, deploying_at=clock())
    backend.survives_cancel.add((0, 0))

    class Ticking(Clock):
        def __call__(self) -> float:
            self.now += 5.0  # the reap deadline passes within a few polls
            return self.now

    ticking = Ticking()
    left = kill_stage(plan, "stage replanned", backends={"local-a": backend, "local-b": backend},
                      observer=backend, clock=ticking)
    assert left == [(0, 0)] and backend.cancelled == [(0, 0)]
    (killed,) = [e for e in read_jsonl(layout.journal) if e["event"] == "killed_all"]
    assert killed["left"] == [[0, 0]]


def test_kill_stage_of_a_stage_without_attempts_journals_only_the_kill(tmp_path: Path, no_controller: None) -> None:
    plan = stage_plan(tmp_path / "store", parallelism=3)
    layout = write_plan(plan)
    backend = FakeBackend(layout, Clock())
    assert kill_stage(plan, "full rerun forced", backends={"local-a": backend, "local-b": backend},
                      observer=backend, clock=Clock()) == []
    assert [e["event"] for e in read_jsonl(layout.journal)] == ["killed_all"]
