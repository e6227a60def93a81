"""The attempts' Spark application ids as XComs under stable keys (control/appids.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.control import appids
from airflow_provider_speculative.control.appids import (
    ADMITTED_APP_IDS_KEY,
    APP_IDS_KEY,
    app_id_xcoms,
    stage_app_ids,
)
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout


def attempt(layout: StageLayout, subtask: int, number: int, app_id: Any = None, admitted: bool = False) -> None:
    """A claimed attempt; with ``app_id``, one that reached a Spark session and recorded it in its heartbeat."""
    atomic_write_json(layout.claim(subtask, number), {"target": "local-a", "created_at": 1.0})
    if app_id is not None:
        atomic_write_json(layout.heartbeat(subtask, number), {"node": "h", "app_id": app_id})
    if admitted:
        atomic_write_json(layout.admitted(subtask), {"attempt": number, "at": 2.0})


@pytest.fixture
def layout(tmp_path: Path) -> StageLayout:
    return StageLayout(tmp_path / "store", "d", "r", "scan")


def test_every_session_in_attempt_order_and_the_admitted_ones(layout: StageLayout) -> None:
    attempt(layout, 0, 0, "app-20261127-0001")
    attempt(layout, 0, 1)  # failed before its session: no id
    attempt(layout, 0, 2, "app-20261127-0003", admitted=True)
    attempt(layout, 0, 10, "app-20261127-0011")  # attempt numbers sort as numbers
    attempt(layout, 1, 0, "local-1764250000000", admitted=True)
    attempt(layout, 2, 0)  # no session at all: the subtask is left out
    every, admitted = stage_app_ids(layout, 4)
    assert every == {"0": ["app-20261127-0001", "app-20261127-0003", "app-20261127-0011"],
                     "1": ["local-1764250000000"]}
    assert admitted == {"0": "app-20261127-0003", "1": "local-1764250000000"}
    assert app_id_xcoms(layout, 4, print) == {APP_IDS_KEY: every, ADMITTED_APP_IDS_KEY: admitted}


def test_what_an_attempt_wrote_that_is_no_id_is_left_out(layout: StageLayout) -> None:
    attempt(layout, 0, 0, 12345)
    attempt(layout, 0, 1, "x" * (appids.MAX_APP_ID_CHARS + 1))
    attempt(layout, 0, 2, "")
    atomic_write_json(layout.heartbeat(0, 3), ["not", "a", "record"])
    assert stage_app_ids(layout, 1) == ({}, {})


def test_a_map_over_the_bound_is_not_pushed_and_the_log_says_so(layout: StageLayout,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for subtask in range(4):
        attempt(layout, subtask, 0, f"app-{subtask}", admitted=subtask < 2)
        attempt(layout, subtask, 1, f"app-{subtask}-copy")
    every, admitted = stage_app_ids(layout, 4)
    # Room for the admitted map, not for every attempt's.
    monkeypatch.setattr(appids, "XCOM_MAX_BYTES", len(json.dumps(admitted)))
    logged: list[str] = []
    xcoms = app_id_xcoms(layout, 4, lambda msg, *args: logged.append(msg % args))
    assert xcoms == {ADMITTED_APP_IDS_KEY: admitted}
    (line,) = logged
    assert f"XCom {APP_IDS_KEY!r} not pushed: its 4 subtasks take {len(json.dumps(every))} bytes" in line
    assert "airflow speculative status --output json" in line


def test_the_bound_holds_a_few_thousand_subtasks_of_spark_ids() -> None:
    # What the documented size rests on: Spark's standalone ids, one attempt per subtask.
    entry = len(json.dumps({"9999": ["app-20261127142231-9999"]})) - 2
    assert 2_500 < appids.XCOM_MAX_BYTES // entry < 4_000
