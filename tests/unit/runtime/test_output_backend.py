"""An attempt's own store I/O by name: heartbeats, freeing its partial output, withdrawn admissions."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.exceptions import StoreFullError
from airflow_provider_speculative.runtime.heartbeat import Heartbeat
from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json, read_json
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout
from tests.unit.control.test_lifecycle import Store  # the store builder gc's tests use
from tests.unit.store.memory import MemoryBackend


def test_a_heartbeat_is_an_atomic_replace_by_name_on_any_backend(tmp_path: Path) -> None:
    store = MemoryBackend()
    beat = Heartbeat("d/r/s/subtask=0/attempt=0/heartbeat.json", lambda: {"tasks_done": 3}, store=store)
    beat.set_phase("WAITING_FOR_INPUT")
    record = store.read_json("d/r/s/subtask=0/attempt=0/heartbeat.json")
    assert record["phase"] == "WAITING_FOR_INPUT" and record["tasks_done"] == 3 and record["pid"] == os.getpid()
    # By path: the same document where it always was.
    Heartbeat(tmp_path / "hb" / "heartbeat.json", dict).beat("RUNNING")
    assert read_json(tmp_path / "hb" / "heartbeat.json")["phase"] == "RUNNING"


def _failed_on_full_store(layout: StageLayout, monkeypatch: pytest.MonkeyPatch) -> int:
    """Leave ``with StageContext`` of attempt 0 of subtask 0 with a full-store error; the exit code."""
    from airflow_provider_speculative.runtime import context as runtime

    assert create_exclusive_json(layout.claim(0, 0), {"target": "local-a", "created_at": 1.0})
    ctx = runtime.StageContext(read_json(layout.plan), 0, 0, "local-a")

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(runtime.os, "_exit", exit_now)
    error = StoreFullError(f"store is full: cannot write {layout.data(0, 0)}: No space left on device")
    with pytest.raises(SystemExit) as exited:
        ctx.__exit__(StoreFullError, error, None)
    assert isinstance(exited.value.code, int)
    return exited.value.code


def _partial_output(layout: StageLayout) -> Path:
    part = layout.data(0, 0) / "_sp=0" / "part-00000.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 100)
    return part


def test_a_full_store_frees_the_attempts_output_by_an_owned_delete(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.runtime.context import EXIT_STORE_FULL

    layout = Store(tmp_path).stage("extract")  # planned: the run's prefix is claimed
    _partial_output(layout)
    assert _failed_on_full_store(layout, monkeypatch) == EXIT_STORE_FULL
    assert not layout.data(0, 0).exists()
    failure = read_json(layout.failure(0, 0))
    assert failure["error"].startswith("StoreFullError: store is full") and "kept" not in failure["error"]


def test_a_full_store_in_a_run_without_a_marker_keeps_the_output_and_says_so(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.runtime.context import EXIT_STORE_FULL

    layout = Store(tmp_path).stage("extract")
    (layout.run_dir / OWNER_FILE).unlink()  # as a run an older version planned
    part = _partial_output(layout)
    # The same exit code, not another error: the refusal is only reported.
    assert _failed_on_full_store(layout, monkeypatch) == EXIT_STORE_FULL
    assert part.read_bytes() == b"x" * 100
    failure = read_json(layout.failure(0, 0))
    assert failure["error"].startswith("StoreFullError: store is full")
    assert "its partial output was kept" in failure["error"] and "no ownership marker of this store" in \
        failure["error"] and str(layout.data(0, 0)) in failure["error"]


def test_a_full_store_with_nothing_written_reports_nothing_kept(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Store(tmp_path).stage("extract")
    (layout.run_dir / OWNER_FILE).unlink()
    _failed_on_full_store(layout, monkeypatch)
    assert "kept" not in read_json(layout.failure(0, 0))["error"]


def _admitted(layout: StageLayout, attempt: int = 0) -> None:
    assert create_exclusive_json(layout.claim(0, attempt), {"target": "local-a", "created_at": 1.0})
    assert create_exclusive_json(layout.admitted(0), {"attempt": attempt, "at": 1.0})


def test_invalidate_withdraws_the_admission_by_an_owned_delete(tmp_path: Path) -> None:
    layout = Store(tmp_path).stage("extract")
    _admitted(layout)
    attempt_observer(layout).invalidate(0, 1, "another attempt's")  # not the admitted one: kept
    assert layout.admitted(0).exists()
    attempt_observer(layout).invalidate(0, 0, "rerun by a user")
    assert not layout.admitted(0).exists()
    assert read_json(layout.invalidated(0, 0))["reason"] == "rerun by a user"


def test_invalidate_in_a_run_without_a_marker_withdraws_as_before(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    layout = Store(tmp_path).stage("extract")
    (layout.run_dir / OWNER_FILE).unlink()
    _admitted(layout)
    with caplog.at_level(logging.WARNING):
        attempt_observer(layout).invalidate(0, 0, "failover")
    # Keeping it would leave a withdrawn attempt admitted: an old run's admission goes by unlink, and says so.
    assert not layout.admitted(0).exists() and layout.invalidated(0, 0).exists()
    assert "withdrawn by unlink" in caplog.text and OWNER_FILE in caplog.text


def test_invalidate_in_an_unmarked_run_of_a_claimed_store_root_withdraws_as_before(tmp_path: Path) -> None:
    layout = Store(tmp_path).stage("extract")
    (layout.run_dir / OWNER_FILE).unlink()
    layout.store.claim("")  # the root's marker (claimed when a store is created) says nothing about this old run
    _admitted(layout)
    attempt_observer(layout).invalidate(0, 0, "failover")
    assert not layout.admitted(0).exists() and layout.invalidated(0, 0).exists()


def test_invalidate_in_a_run_another_store_owns_refuses_and_keeps_the_admission(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "etl", "r1", "extract")
    PosixBackend(tmp_path, owner="file:///elsewhere").claim(layout.run_prefix)
    atomic_write_json(layout.plan, {"stage": "extract"})
    _admitted(layout)
    with pytest.raises(RunNotOwnedError, match="no ownership marker of this store"):
        attempt_observer(layout).invalidate(0, 0, "failover")
    assert read_json(layout.admitted(0)) == {"attempt": 0, "at": 1.0}
