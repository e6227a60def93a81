"""HybridInputsTrigger: fires ready, failed (naming the input) or waiting after its window; serializes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.task_state import record_task_state
from airflow_provider_speculative.triggers import hybrid
from airflow_provider_speculative.triggers.hybrid import HybridInputsTrigger
from tests.unit.store.memory import MemoryBackend


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


def _trigger(layout: StageLayout, window: float = 60.0, *, by_path: bool = False) -> HybridInputsTrigger:
    # by_path: an entry serialized by a version that named only the stage directory.
    entry = {"stage": "scan", "dir": str(layout.dir)} if by_path else {
        "stage": "scan", "dir": str(layout.dir), "store": layout.store_root, "name": layout.name(layout.dir),
        "conn_id": ""}
    return HybridInputsTrigger(where="pipeline 'p', stage 'c'", inputs={"rows": entry},
                               clear_number=0, deferred_at=time.time(), window=window)


@pytest.fixture(params=["posix", "s3-memory"])
def producer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StageLayout]:
    """The producer stage's layout: on a POSIX tmp dir, or on an S3 root served by the in-memory backend."""
    if request.param == "posix":
        yield StageLayout(tmp_path, "d", "r", "scan")
        return
    roots.forget_stores()
    memory = MemoryBackend("s3://lake/store")
    roots.install_store(memory)
    yield StageLayout.over(memory, "d", "r", "scan")
    roots.forget_stores()


def test_fires_waiting_after_its_window_then_ready_then_failed(producer: StageLayout, fast: None) -> None:
    layout = producer
    assert _first_event(_trigger(layout, window=0.05)) == {"status": "waiting"}
    layout.replace_json(layout.plan, {"fingerprint": "f", "clear_number": 0})
    assert _first_event(_trigger(layout)) == {"status": "ready"}
    record_task_state(layout, "failed", try_number=2, clear_number=0, reason="boom")
    assert _first_event(_trigger(layout)) == {
        "status": "failed", "reason": "pipeline 'p', stage 'c', input 'rows': hybrid producer stage 'scan' failed "
                                      "(try 2): boom"}


def test_an_entry_serialized_by_an_older_version_is_read_by_path(tmp_path: Path, fast: None) -> None:
    layout = StageLayout(tmp_path, "d", "r", "scan")
    assert _first_event(_trigger(layout, window=0.05, by_path=True)) == {"status": "waiting"}
    atomic_write_json(layout.plan, {"fingerprint": "f", "clear_number": 0})
    assert _first_event(_trigger(layout, by_path=True)) == {"status": "ready"}


def test_serializes_everything_it_needs(tmp_path: Path) -> None:
    trigger = _trigger(StageLayout(tmp_path, "d", "r", "scan"))
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_speculative.triggers.hybrid.HybridInputsTrigger"
    assert HybridInputsTrigger(**kwargs).serialize() == (path, kwargs)
