"""Slot claims in the store: exclusive, shared across stages, released by the holder, reclaimed only when gone."""

from __future__ import annotations

import threading

from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.slots import TargetSlots, holder_record


def test_claims_are_exclusive_and_bounded_by_capacity(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    assert slots.dir == tmp_path / "_targets" / "t" / "slots"
    first = slots.claim(2, {"who": 1})
    second = slots.claim(2, {"who": 2})
    assert first[0] == 0 and second[0] == 1 and slots.claim(2, {"who": 3}) is None
    assert slots.count() == 2
    assert slots.release(*first) and slots.count() == 1
    # The lowest free index is reused.
    assert slots.claim(2, {"who": 4})[0] == 0


def test_concurrent_claimers_never_oversubscribe(tmp_path):
    won: list[tuple[int, str]] = []
    lock = threading.Lock()

    def claimer(i: int) -> None:
        got = TargetSlots(tmp_path, "t").claim(3, {"who": i})
        if got:
            with lock:
                won.append(got)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(index for index, _ in won) == [0, 1, 2]


def test_release_never_removes_someone_elses_claim(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    index, token = slots.claim(1, {"who": "old"})
    slots.path(index).unlink()  # reclaimed by another controller...
    slots.claim(1, {"who": "new"})  # ... and taken by a new holder
    assert not slots.release(index, token)
    assert slots.holders()[0]["who"] == "new"


def test_only_gone_holders_are_reclaimed(tmp_path):
    now = 1000.0
    layout = StageLayout(tmp_path, "d", "r", "s")
    slots = TargetSlots(tmp_path, "t")
    records = {}
    for subtask, status in enumerate([{"state": "FINISHED"}, {"state": "RUNNING", "alive_at": now - 1},
                                      {"state": "RUNNING", "alive_at": now - 300}, None]):
        create_exclusive_json(layout.claim(subtask, 0), {"target": "t"})
        if status is not None:
            atomic_write_json(layout.status(subtask, 0), status)
        records[subtask] = slots.claim(4, holder_record(layout, subtask, 0, now - 5))
    freed = slots.reclaim_gone(now)
    assert sorted((holder["subtask"], why.split()[0]) for _, holder, why in freed) == [
        (0, "attempt"), (2, "supervisor")]
    # The live holder and the one launched a moment ago keep their slots.
    assert sorted(h["subtask"] for h in slots.holders().values()) == [1, 3]
    # A holder whose run directory was removed never launches: reclaimed after the grace.
    gone = TargetSlots(tmp_path, "u")
    gone.claim(1, holder_record(StageLayout(tmp_path, "x", "y", "z"), 0, 0, now - 600))
    assert [why for _, _, why in gone.reclaim_gone(now)] == ["attempt never launched"]
