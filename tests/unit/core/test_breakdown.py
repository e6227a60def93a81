"""An attempt's time breakdown from its claim, status and manifest timings."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.breakdown import (
    attempt_phases,
    breakdown_line,
    critical_path,
    critical_path_line,
    stage_breakdown,
)

TIMINGS = {"entered_at": 100.2, "session_ready_at": 100.5, "write_started_at": 101.0, "verify_s": 0.1,
           "write_s": 3.0, "manifest_s": 0.25}


def test_phases_add_up_to_the_attempt_from_claim_to_end() -> None:
    phases = attempt_phases(99.5, 100.0, 104.5, TIMINGS)
    assert phases == pytest.approx({"queue": 0.5, "start": 0.5, "app": 0.5, "verify": 0.1, "spark": 3.0,
                                    "commit": 0.25, "exit": 0.25})
    assert sum(v for k, v in phases.items() if k != "verify") == pytest.approx(104.5 - 99.5)


def test_an_attempt_without_a_manifest_has_only_its_queue() -> None:
    phases = attempt_phases(99.5, 100.0, 101.0, None)
    assert phases["queue"] == 0.5 and all(phases[k] is None for k in ("start", "app", "spark", "commit", "exit"))


def test_the_stage_line_shows_medians_of_what_was_recorded() -> None:
    rows = [attempt_phases(0, 1, 6.5, {**TIMINGS, "session_ready_at": 1.5, "write_started_at": 2.0}),
            attempt_phases(0, 2, 7.5, {**TIMINGS, "session_ready_at": 2.5, "write_started_at": 3.0}),
            attempt_phases(None, None, None, None)]
    medians = stage_breakdown(rows)
    assert medians["queue"] == 1.5 and medians["spark"] == 3.0 and medians["verify"] == 0.1
    line = breakdown_line(medians, 2)
    assert line is not None and line.startswith("time per admitted attempt (median of 2, s): queue 1.50")
    assert "app 0.50 (verify 0.10)" in line and "spark 3.00" in line
    assert breakdown_line({}, 0) is None


def _stage(name: str, upstreams: list[str], *attempts: tuple[float, float | None, bool]) -> dict:
    return {"stage": name, "upstreams": upstreams, "subtasks": [
        {"attempts": [{"start": start, "end": end, "admitted": admitted}]} for start, end, admitted in attempts]}


def test_the_critical_path_follows_the_upstream_that_ended_last() -> None:
    stages = [
        _stage("scan_a", [], (0.0, 10.0, True), (0.5, 30.0, False)),  # an unadmitted loser does not end a stage
        _stage("scan_b", [], (0.0, 20.0, True)),
        _stage("join", ["scan_a", "scan_b"], (21.0, 35.0, True), (21.5, 40.0, True)),
        _stage("side", [], (1.0, 5.0, True)),
        _stage("top", ["join", "side"], (41.0, 42.0, True)),
    ]
    path = critical_path(stages)
    assert [(e["stage"], e["span"], e["gap"]) for e in path] == [
        ("scan_b", 20.0, None), ("join", 19.0, 1.0), ("top", 1.0, 1.0)]
    line = critical_path_line(path)
    assert line is not None and "scan_b 20.00 -> +1.00 -> join 19.00 -> +1.00 -> top 1.00" in line
    assert "42.00 from its first attempt to its last end, 40.00 in stages" in line


def test_a_hybrid_consumer_that_started_early_shows_an_overlap() -> None:
    path = critical_path([_stage("p", [], (0.0, 10.0, True)), _stage("c", ["p"], (4.0, 12.0, True))])
    assert path[1]["gap"] == -6.0 and "overlap 6.00" in (critical_path_line(path) or "")


def test_no_critical_path_before_any_stage_has_an_admitted_attempt() -> None:
    assert critical_path([_stage("p", [], (0.0, None, False))]) == [] and critical_path_line([]) is None
