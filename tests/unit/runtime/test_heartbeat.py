"""The runtime heartbeat: phases and the time an attempt spends waiting for hybrid input."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_speculative.runtime.heartbeat import Heartbeat
from airflow_provider_speculative.store.files import read_json
from tests.factories import Clock


def test_waiting_for_input_is_accounted_in_every_beat(tmp_path: Path, monkeypatch) -> None:
    clock = Clock(100.0)
    monkeypatch.setattr("airflow_provider_speculative.runtime.heartbeat.time.time", clock)
    path = tmp_path / "heartbeat.json"
    beat = Heartbeat(path, dict)
    beat.set_phase("WAITING_FOR_INPUT")
    assert [read_json(path)[k] for k in ("phase", "waiting_since", "input_wait")] == ["WAITING_FOR_INPUT", 100.0, 0.0]
    clock.now = 200.0
    beat.set_phase("RUNNING")
    assert [read_json(path)[k] for k in ("phase", "waiting_since", "input_wait")] == ["RUNNING", None, 100.0]
    clock.now = 250.0
    beat.set_phase("RUNNING")  # no wait going on: nothing more is counted
    beat.set_phase("WAITING_FOR_INPUT")
    clock.now = 260.0
    beat.set_phase("RUNNING")
    assert read_json(path)["input_wait"] == 110.0


def test_progress_after_the_application_stopped_its_session_keeps_the_app_id() -> None:
    from types import SimpleNamespace

    from airflow_provider_speculative.runtime.context import StageContext

    # An unmodified script's spark.stop() leaves a session without a context.
    for stopped in (SimpleNamespace(_jsc=None), None):
        attempt = SimpleNamespace(input_bytes=0, _session_info={"app_id": "local-1", "session_ready_at": 1.0},
                                  _inputs=SimpleNamespace(reads={}), _remote=False, _remote_progress={},
                                  _spark=SimpleNamespace(sparkContext=stopped))
        progress = StageContext._progress(attempt)  # type: ignore[arg-type]
        assert progress["app_id"] == "local-1" and "tasks_done" not in progress
