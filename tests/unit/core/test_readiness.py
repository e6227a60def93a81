"""Pure matching logic of StageOutputSensor: logical dates, subtasks, subpartitions, messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from airflow_provider_speculative.core.readiness import (
    check_committed,
    describe_wait,
    parse_instant,
    partition_key,
    same_instant,
)

RECORD = {"stage": "scan", "parallelism": 3, "committed_at": 5.0, "subtasks": {
    "0": {"attempt": 0, "subpartition_bytes": {"0": 10, "1": 0}},
    "1": {"attempt": 2, "subpartition_bytes": {"2": 7}},
    "2": {"attempt": 0, "subpartition_bytes": {}},
}}


def test_logical_dates_match_across_time_zones_and_string_forms() -> None:
    utc = datetime(2026, 1, 1, tzinfo=UTC)
    assert same_instant("2026-01-01T00:00:00+00:00", utc)
    assert same_instant("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00Z")
    assert same_instant("2026-01-01T00:00:00", utc)  # naive means UTC
    assert not same_instant("2026-01-02T00:00:00+00:00", utc)
    assert not same_instant(None, utc)
    assert parse_instant(datetime(2026, 1, 1, 3, tzinfo=timezone(timedelta(hours=3)))) == utc


def test_a_malformed_logical_date_is_rejected_with_its_value() -> None:
    with pytest.raises(ValueError, match="'yesterday'"):
        parse_instant("yesterday")


def test_partition_key_uses_airflows_default_key_format_in_utc() -> None:
    assert partition_key("2026-03-13T10:42:15+02:00") == "2026-03-13T08:42:15"
    assert partition_key(None) is None


def test_not_committed_reports_everything_requested_as_missing() -> None:
    readiness = check_committed(None, subtasks=[1, 0], subpartitions=[2])
    assert not readiness.ready and not readiness.committed
    assert readiness.missing_subtasks == (0, 1) and readiness.missing_subpartitions == (2,)


def test_committed_without_filters_is_ready() -> None:
    assert check_committed(RECORD).ready


def test_subtasks_must_be_in_the_commit() -> None:
    assert check_committed(RECORD, subtasks=[0, 2]).ready
    readiness = check_committed(RECORD, subtasks=[2, 3, 7])
    assert not readiness.ready and readiness.missing_subtasks == (3, 7)


def test_a_subpartition_is_available_only_if_some_subtask_wrote_bytes_for_it() -> None:
    assert check_committed(RECORD, subpartitions=[0, 2]).ready
    readiness = check_committed(RECORD, subpartitions=[0, 1, 3])
    assert readiness.missing_subpartitions == (1, 3)  # 1 has zero bytes, 3 no entry


def test_the_wait_message_names_dag_stage_date_and_what_is_missing() -> None:
    date = "2026-01-01T00:00:00+00:00"
    assert describe_wait("up", "agg", date, None, None) == (
        "DAG 'up', stage 'agg', logical date 2026-01-01T00:00:00+00:00: no run of that DAG with this "
        "logical date in the store yet")
    pending = describe_wait("up", "agg", date, "r1", check_committed(None, [1], [4]), [1], [4])
    assert "stage not committed yet" in pending and "subtasks [1]" in pending and "subpartitions [4]" in pending
    partial = describe_wait("up", "agg", date, "r1", check_committed(RECORD, [5], [9]), [5], [9])
    assert "stage committed (parallelism 3)" in partial
    assert "no subtasks [5]" in partial and "subpartitions [9]" in partial
    by_run = describe_wait("up", "agg", None, "manual__x", check_committed(None))
    assert by_run.startswith("DAG 'up', stage 'agg', run 'manual__x': stage not committed yet")
