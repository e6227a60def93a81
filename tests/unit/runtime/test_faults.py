"""Faults inside an attempt: what the hook answers for its stage is what the attempt does, and nothing else."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_provider_speculative.core.faults import NO_FAULTS, FaultInjection, FaultSpec
from airflow_provider_speculative.runtime.faults import inject_faults, wait_at_barrier
from airflow_provider_speculative.runtime.heartbeat import Heartbeat
from airflow_provider_speculative.store.layout import StageLayout


class NodeLost(Exception):
    """What the attempt raises when its executors are gone."""


@pytest.fixture
def setting(tmp_path: Path) -> tuple[Heartbeat, StageLayout]:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    layout.dir.mkdir(parents=True)
    return Heartbeat(tmp_path / "heartbeat.json", dict), layout


def test_no_faults_do_nothing(setting) -> None:
    heartbeat, layout = setting
    inject_faults(NO_FAULTS, "local-a", 0, 0, heartbeat, layout, lambda: NodeLost("gone"))
    assert heartbeat.phase == "RUNNING"


def test_an_injected_failure_fails_only_its_attempt(setting) -> None:
    heartbeat, layout = setting
    faults = FaultInjection(attempts={(1, 0): FaultSpec(fail=True)})
    inject_faults(faults, "local-a", 1, 1, heartbeat, layout, lambda: None)
    with pytest.raises(RuntimeError, match=r"injected failure \(fault injection\) for subtask 1 attempt 0"):
        inject_faults(faults, "local-a", 1, 0, heartbeat, layout, lambda: None)


def test_a_node_lost_during_an_injected_delay_ends_it_at_once(setting) -> None:
    heartbeat, layout = setting
    started = time.monotonic()
    with pytest.raises(NodeLost):
        inject_faults(FaultInjection(targets={"local-b": FaultSpec(delay=600.0)}), "local-b", 0, 0, heartbeat,
                      layout, lambda: NodeLost("executors gone"))
    assert time.monotonic() - started < 60


def test_the_barrier_holds_until_its_release_exists(setting) -> None:
    heartbeat, layout = setting
    layout.barrier_release(0).touch()
    inject_faults(FaultInjection(barrier=True), "local-a", 0, 0, heartbeat, layout, lambda: None)
    assert heartbeat.phase == "BARRIER"
    with pytest.raises(TimeoutError, match=r"barrier .*barrier.release.1 was not released"):
        wait_at_barrier(layout, 1, heartbeat, timeout=0.05)
