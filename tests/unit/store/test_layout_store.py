"""StageLayout's store helpers and the stage journal: the files store/files.py writes, byte for byte."""

from __future__ import annotations

import threading
from pathlib import Path

from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.store import files
from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.store.journal import Journal
from airflow_provider_speculative.store.layout import StageLayout


def test_replace_json_writes_the_bytes_of_atomic_write_json(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    layout.replace_json(layout.committed, {"b": 1, "a": [1, 2]})
    files.atomic_write_json(tmp_path / "reference.json", {"b": 1, "a": [1, 2]})
    assert layout.committed.read_bytes() == (tmp_path / "reference.json").read_bytes()
    assert layout.read_json(layout.committed) == {"a": [1, 2], "b": 1}
    layout.replace_json(layout.committed, {"c": 3})
    assert layout.read_json(layout.committed) == {"c": 3}


def test_create_json_is_exclusive_and_writes_the_bytes_of_a_claim(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    won: list[bool] = []
    barrier = threading.Barrier(8)

    def create(index: int) -> None:
        barrier.wait()
        won.append(layout.create_json(layout.admitted(0), {"attempt": index}))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False] * 7 + [True]
    winner = layout.read_json(layout.admitted(0))
    assert layout.admitted(0).read_bytes() == files.json_claim(winner)


def test_read_json_and_exists_of_missing_objects(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    assert layout.read_json(layout.plan) is None
    assert layout.read_json(layout.plan, {}) == {}
    assert not layout.exists(layout.claim(0, 0))
    layout.create_json(layout.claim(0, 0), {"target": "t"})
    assert layout.exists(layout.claim(0, 0))


def test_wait_for_ends_on_the_object_or_at_the_timeout(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    _, release = layout.commit_hold()
    assert not layout.wait_for(release, timeout=0.05, interval=0.01)
    layout.replace_json(release, {})
    assert layout.wait_for(release, timeout=0, interval=0.01)


def test_stage_journal_appends_to_journal_jsonl_through_the_layout_store(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    journals.record_stage(layout, Event.FINALIZE_STARTED, at=1.0, by="worker")
    journal = Journal.of_stage(layout, lambda: 2.0, subtask=3)
    assert journal.store is layout.store
    journal(Event.RECOVERED, attempt=1)
    assert journals.read(layout.journal) == [
        {"at": 1.0, "event": "finalize_started", "by": "worker"},
        {"at": 2.0, "event": "recovered", "subtask": 3, "attempt": 1}]
    assert layout.journal.read_bytes() == (
        files.json_line({"at": 1.0, "event": "finalize_started", "by": "worker"})
        + files.json_line({"at": 2.0, "event": "recovered", "subtask": 3, "attempt": 1}))
