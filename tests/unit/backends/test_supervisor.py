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


def test_a_held_end_on_a_store_without_paths_waits_for_the_release_object() -> None:
    """On S3 the controller names the release by its URL: the supervisor polls that object by name."""
    import threading

    from airflow_provider_speculative.backends.supervisor import AttemptDocuments, _hold_end
    from tests.unit.store.memory import MemoryBackend

    store = MemoryBackend("s3://bucket/root")
    docs = AttemptDocuments("d/r/s/subtask=0/attempt=0/status.json", "d/r/s/subtask=0/attempt=0/manifest.json",
                            store=store)
    status: dict[str, object] = {"state": "DEPLOYING"}

    def release_once_held() -> None:
        _until(lambda: (store.read_json(docs.status) or {}).get("held_at"), "the hold to be recorded")
        assert not ended.is_set(), "the end was recorded before its release"
        store.replace("d/r/s/barrier.release.0", b"")

    ended = threading.Event()
    releaser = threading.Thread(target=release_once_held)
    releaser.start()
    started = time.monotonic()
    _hold_end("s3://bucket/root/d/r/s/barrier.release.0", docs, status, {"signal": None}, timeout=600)
    ended.set()
    releaser.join()
    # Ended by the release, not by the hold's timeout (a wait for a local file of that name never ends).
    assert time.monotonic() - started < 300 and store.exists("d/r/s/barrier.release.0") and status["held_at"]
