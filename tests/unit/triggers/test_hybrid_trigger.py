"""HybridInputsTrigger: fires ready, failed (naming the input) or waiting after its window; serializes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.task_state import record_task_state
from airflow_provider_speculative.triggers import hybrid
from airflow_provider_speculative.triggers.hybrid import HybridInputsTrigger


def _first_event(trigger: HybridInputsTrigger) -> dict:
    async def run() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    return asyncio.run(run())


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hybrid, "min_seconds_before_event", lambda: 0.0)
    monkeypatch.setattr(hybrid, "POLL_SECONDS", 0.01)


def _trigger(layout: StageLayout, window: float = 60.0) -> HybridInputsTrigger:
    return HybridInputsTrigger(where="pipeline 'p', stage 'c'",
                               inputs={"rows": {"stage": "scan", "dir": str(layout.dir)}},
                               clear_number=0, deferred_at=time.time(), window=window)


def test_fires_waiting_after_its_window_then_ready_then_failed(tmp_path: Path, fast: None) -> None:
    layout = StageLayout(tmp_path, "d", "r", "scan")
    assert _first_event(_trigger(layout, window=0.05)) == {"status": "waiting"}
    atomic_write_json(layout.plan, {"fingerprint": "f", "clear_number": 0})
    assert _first_event(_trigger(layout)) == {"status": "ready"}
    record_task_state(layout, "failed", try_number=2, clear_number=0, reason="boom")
    assert _first_event(_trigger(layout)) == {
        "status": "failed", "reason": "pipeline 'p', stage 'c', input 'rows': hybrid producer stage 'scan' failed "
                                      "(try 2): boom"}


def test_serializes_everything_it_needs(tmp_path: Path) -> None:
    trigger = _trigger(StageLayout(tmp_path, "d", "r", "scan"))
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_speculative.triggers.hybrid.HybridInputsTrigger"
    assert HybridInputsTrigger(**kwargs).serialize() == (path, kwargs)
