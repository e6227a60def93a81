"""The attempt supervisor as a real process: fault injection's held end (``hold_end``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.store.files import atomic_write_json, read_json


def _until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def held(tmp_path: Path):
    """Start a supervisor whose command writes a manifest and exits 0, with its end held."""
    attempt = tmp_path / "attempt=0"
    attempt.mkdir()
    release = tmp_path / "barrier.release.0"
    manifest = attempt / "manifest.json"
    app = f"import json; open({str(manifest)!r}, 'w').write(json.dumps({{'files': []}}))"
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_speculative.backends.supervisor",
         "--status", str(attempt / "status.json"), "--log", str(attempt / "log"), "--manifest", str(manifest),
         "--", sys.executable, "-c", app],
        env={**os.environ, "SPECULATIVE_HOLD_END": str(release)})
    status = lambda: read_json(attempt / "status.json") or {}  # noqa: E731
    _until(lambda: status().get("held_at"), "the supervisor to hold the end")
    yield attempt, release, status, proc
    proc.kill()
    proc.wait()


def test_a_held_end_is_recorded_only_after_the_release(held) -> None:
    _attempt, release, status, proc = held
    assert status()["state"] == "DEPLOYING" and proc.poll() is None
    release.touch()
    assert proc.wait(timeout=30) == 0
    assert status()["state"] == "FINISHED"
    assert status()["end_at"] >= status()["held_at"]


def test_a_cancel_during_the_hold_ends_the_attempt_cancelled(held) -> None:
    attempt, _release, status, proc = held
    atomic_write_json(attempt / "cancel.json", {"reason": "test", "at": time.time()})
    proc.wait(timeout=30)
    assert status()["state"] == "CANCELED"
