"""An attempt's time breakdown from its claim, status and manifest timings."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.breakdown import attempt_phases, breakdown_line, stage_breakdown

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
