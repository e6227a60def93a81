"""SupervisedBackend.poll: from the status, heartbeat, cancel and invalidation files to an attempt state."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_provider_speculative.backends import supervised
from airflow_provider_speculative.backends.identity import start_ticks
from airflow_provider_speculative.backends.registry import create_backend, kind_for_conn_type
from airflow_provider_speculative.backends.supervised import LAUNCH_LOST_AFTER, REMOTE_ALIVE_TIMEOUT, SupervisedBackend
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.exceptions import TargetError
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout

S = AttemptState
NOW = time.time()
DEAD_PID = 999_999_999


def _write(layout: StageLayout, *, status: dict[str, Any] | None = None, heartbeat: dict[str, Any] | None = None,
           cancel: bool = False, invalidated: bool = False, claimed_at: float = NOW) -> None:
    atomic_write_json(layout.claim(0, 0), {"target": "local-a", "node": "node-a", "created_at": claimed_at})
    if status is not None:
        atomic_write_json(layout.status(0, 0), status)
    if heartbeat is not None:
        atomic_write_json(layout.heartbeat(0, 0), heartbeat)
    if cancel:
        atomic_write_json(layout.attempt_dir(0, 0) / "cancel.json", {"reason": "test", "at": NOW})
    if invalidated:
        atomic_write_json(layout.attempt_dir(0, 0) / "invalidated.json", {"reason": "rerun", "at": NOW})


def _me() -> dict[str, Any]:
    """A status whose pid is this (live) test process."""
    return {"pid": os.getpid(), "pgid": os.getpgid(0), "create_time": psutil.Process().create_time(),
            "deploying_at": NOW - 5, "launched_at": NOW - 6, "host": supervised.HOST}


CASES = [
    # (case, status, heartbeat, cancel, invalidated, claimed_at, expected state)
    ("claimed, not started yet", None, None, False, False, NOW, S.CREATED),
    ("claimed, never started (launch lost)", None, None, False, False, NOW - LAUNCH_LOST_AFTER - 1, S.FAILED),
    ("supervisor up, no heartbeat", _me(), None, False, False, NOW, S.DEPLOYING),
    ("heartbeat RUNNING", _me(), {"phase": "RUNNING"}, False, False, NOW, S.RUNNING),
    ("heartbeat at barrier", _me(), {"phase": "BARRIER"}, False, False, NOW, S.RUNNING),
    ("cancel requested, still alive", _me(), {"phase": "RUNNING"}, True, False, NOW, S.CANCELING),
    ("process gone after cancel", {**_me(), "pid": DEAD_PID}, None, True, False, NOW, S.CANCELED),
    ("process gone without cancel", {**_me(), "pid": DEAD_PID}, None, False, False, NOW, S.FAILED),
    ("pid reused by another process", {**_me(), "create_time": 1.0}, None, False, False, NOW, S.FAILED),
    ("pid reused (start ticks differ)", {**_me(), "start_ticks": -1}, None, False, False, NOW, S.FAILED),
    ("wall clock stepped since launch", {**_me(), "create_time": 1.0, "start_ticks": start_ticks(os.getpid())},
     {"phase": "RUNNING"}, False, False, NOW, S.RUNNING),
    ("recorded FINISHED", {**_me(), "state": "FINISHED", "end_at": NOW}, None, False, False, NOW, S.FINISHED),
    ("recorded FAILED", {**_me(), "state": "FAILED", "end_at": NOW}, None, False, False, NOW, S.FAILED),
    ("invalidated wins over FINISHED", {**_me(), "state": "FINISHED"}, None, False, True, NOW, S.CANCELED),
    ("other host, fresh alive_at", {**_me(), "pid": DEAD_PID, "host": "elsewhere", "alive_at": NOW - 1},
     {"phase": "RUNNING"}, False, False, NOW, S.RUNNING),
    ("other host, stale alive_at", {**_me(), "pid": DEAD_PID, "host": "elsewhere",
                                    "alive_at": NOW - REMOTE_ALIVE_TIMEOUT - 1, "deploying_at": NOW - 100},
     {"phase": "RUNNING"}, False, False, NOW, S.FAILED),
]


@pytest.mark.parametrize(("status", "heartbeat", "cancel", "invalidated", "claimed_at", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_poll_maps_store_files_to_states(tmp_path: Path, status: Any, heartbeat: Any, cancel: bool,
                                         invalidated: bool, claimed_at: float, expected: AttemptState) -> None:
    layout = StageLayout(tmp_path, "d", "r", "scan")
    _write(layout, status=status, heartbeat=heartbeat, cancel=cancel, invalidated=invalidated, claimed_at=claimed_at)
    assert SupervisedBackend(layout).poll(0, 0, NOW).state == expected


def test_poll_reports_node_app_id_and_startup(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "d", "r", "scan")
    _write(layout, status=_me(), heartbeat={"phase": "RUNNING", "node": "worker-2", "app_id": "app-7",
                                            "session_ready_at": NOW - 4.5})
    attempt = SupervisedBackend(layout).poll(0, 0, NOW)
    assert (attempt.node, attempt.app_id) == ("worker-2", "app-7")
    assert attempt.startup_seconds == pytest.approx(1.5)


def test_a_remote_attempt_is_never_signalled_locally(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "d", "r", "scan")
    # The pgid is this test's own group: a local killpg would kill the test run.
    _write(layout, status={**_me(), "host": "elsewhere", "alive_at": NOW}, heartbeat={"phase": "RUNNING"})
    backend = SupervisedBackend(layout)
    backend.cancel(0, 0, "test")
    assert (layout.attempt_dir(0, 0) / "cancel.json").exists()  # the remote supervisor acts on this
    assert backend.reap(0, 0, NOW) is False  # until the remote supervisor records the end


def test_factory_picks_the_backend_by_kind(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "d", "r", "scan")
    assert create_backend("spark_submit", layout).kind == "spark_submit"
    assert kind_for_conn_type("spark", target="a", conn_id="c") == "spark_submit"
    assert kind_for_conn_type("spark_connect", target="a", conn_id="c") == "spark_connect"
    with pytest.raises(TargetError, match="target 'a': connection 'pg' has type 'postgres'"):
        kind_for_conn_type("postgres", target="a", conn_id="pg")
    with pytest.raises(TargetError, match="unknown backend kind 'yarnish'"):
        create_backend("yarnish", layout)


def test_poll_reports_time_waiting_for_hybrid_input(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    _write(layout, status=_me(), heartbeat={"phase": "WAITING_FOR_INPUT", "input_wait": 4.5, "waiting_since": NOW - 2})
    attempt = SupervisedBackend(layout).poll(0, 0, NOW)
    assert (attempt.state, attempt.input_wait, attempt.waiting_since) == (S.RUNNING, 4.5, NOW - 2)
