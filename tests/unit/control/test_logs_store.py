"""Attempt logs in the controller's task log on a POSIX store and on an S3 root (the in-memory backend installed).

On S3 a running attempt's log is a local file of its supervisor's host; it reaches the store by name when the
attempt ends. The driver log stream and a failed stage's log lines then read it by name, and never make a
file-system call on a store path (``tests/unit/store/no_store_paths.py``); a running attempt shows nothing yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_speculative.control.attemptlog import failure_log_lines
from airflow_provider_speculative.control.logstream import DriverLogStream
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S3_ROOT = "s3://lake/speculative"
LOG = b"starting\nreading 3 files\nboom: ValueError\n"


@pytest.fixture(params=["posix", "s3"])
def layout(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StageLayout]:
    roots.forget_stores()
    if request.param == "s3":
        roots.install_store(MemoryBackend(S3_ROOT))
    stage = StageLayout.of_plan(stage_plan(S3_ROOT if request.param == "s3" else str(tmp_path / "store")))
    stage.claim_run()
    stage.create_json(stage.claim(0, 0), {"target": "local-a", "created_at": 1.0})
    if request.param == "s3":
        refuse_store_paths(monkeypatch, S3_ROOT)
    yield stage
    roots.forget_stores()


def _write_log(layout: StageLayout) -> None:
    """The log as the attempt's end leaves it: in its directory on POSIX, uploaded by name on S3."""
    if isinstance(layout.store, PosixBackend):
        Path(os.fspath(layout.log(0, 0))).write_bytes(LOG)
    else:
        layout.store.replace(layout.name(layout.log(0, 0)), LOG)


def test_an_ended_attempts_log_reaches_the_task_log(layout: StageLayout) -> None:
    stream = DriverLogStream(layout, max_lines=20, max_bytes=4096, since=0.0)
    running = Attempt(0, 0, "local-a", AttemptState.RUNNING, end_at=None)
    if not isinstance(layout.store, PosixBackend):
        # Running: the log is on the supervisor's host, not yet in the store; nothing shown, nothing refused.
        assert stream.step([running], now=1.0) == []
    _write_log(layout)
    ended = Attempt(0, 0, "local-a", AttemptState.FAILED, end_at=5.0)
    lines = stream.step([ended], now=10.0, final=True)
    assert lines[-1] == "subtask 0 attempt 0 (target local-a): boom: ValueError"
    assert failure_log_lines(layout, [(0, 0)])[-1] == "  | boom: ValueError"


def test_a_failed_stage_without_an_uploaded_log_still_says_where_logs_are(layout: StageLayout) -> None:
    lines = failure_log_lines(layout, [(0, 0)])
    assert "subtask=<i>/attempt=<k>/spark-submit.log" in lines[0]
    if isinstance(layout.store, PosixBackend):
        assert len(lines) == 1
    else:
        # On S3 the missing log is named by its URL, and why it is missing (no supervisor status: never started).
        assert lines[1:] == [f"subtask 0 attempt 0's log {S3_ROOT}/{layout.name(layout.log(0, 0))}: "
                             "not written (its supervisor never started)"]
