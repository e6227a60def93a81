"""Slot claims in the store: exclusive, shared across stages, released by the holder, reclaimed only when gone."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.files import atomic_write_json, create_exclusive_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.slots import TargetSlots, holder_record
from tests.unit.store import memory
from tests.unit.store.slot_race import LateSlots, objects_per_slot, race_slots


def _run_together(target: Callable[[int], Any], indices: Any) -> None:
    """Run ``target(i)`` for every index in its own thread and wait for all of them."""
    threads = [threading.Thread(target=target, args=(i,)) for i in indices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


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

    _run_together(claimer, range(12))
    assert sorted(index for index, _ in won) == [0, 1, 2]


def test_release_never_removes_someone_elses_claim(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    index, token = slots.claim(1, {"who": "old"})
    # Reclaimed by another controller (the old holder was presumed gone)...
    create_exclusive_json(Path(f"{slots.path(index)}.released"), {"by": "reclaim"})
    assert slots.claim(1, {"who": "new"})[0] == index  # ... and taken by a new holder
    assert not slots.release(index, token)
    assert slots.holders()[0]["who"] == "new" and slots.count() == 1


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


# -- release and reclaim by release records (no rename), pruning by owned deletes ------------------


class MemoryBackend(memory.MemoryBackend):
    """The shared store double (tests/unit/store/memory.py), held to what slots use: no journal, no prefix delete."""

    def _append(self, journal: str, record: dict[str, Any]) -> None:
        raise AssertionError("slots never append")

    def _read_journal(self, journal: str) -> list[dict[str, Any]]:
        raise AssertionError("slots never read a journal")

    def _delete_tree(self, prefix: str, names: list[str]) -> int:
        raise AssertionError("slots delete objects one by one")


def _no_renames(monkeypatch: pytest.MonkeyPatch, under: Path) -> list[str]:
    """Make every rename or replace of a claim or release record below ``under`` fail; return what was tried.

    Deletes are pruning's, through the backend's owned ``delete``; the temporary file of an exclusive
    create is removed once linked in place.
    """
    tried: list[str] = []

    def guard(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(src: Any, *args: Any, **kwargs: Any) -> Any:
            if str(src).startswith(str(under)) and not str(src).endswith(".tmp"):
                tried.append(f"{name} {src}")
                raise AssertionError(f"{name} of {src}")
            return real(src, *args, **kwargs)
        return call

    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, guard(f"os.{name}", getattr(os, name)))
        monkeypatch.setattr(Path, name, guard(f"Path.{name}", getattr(Path, name)))
    return tried


def test_release_and_reclaim_use_release_records_and_no_rename(tmp_path, monkeypatch):
    now = 1000.0
    slots = TargetSlots(tmp_path, "t")
    tried = _no_renames(monkeypatch, slots.dir)
    layout = StageLayout(tmp_path, "d", "r", "s")
    index, token = slots.claim(2, holder_record(layout, 0, 0, now - 600))  # never launched: gone
    assert slots.release(index, token) and not slots.release(index, token)
    assert json.loads((slots.dir / "slot-0.json.released").read_text())["by"] == "holder"
    assert slots.claim(2, holder_record(layout, 1, 0, now - 600))[0] == 0
    assert [why for _, _, why in slots.reclaim_gone(now)] == ["attempt never launched"]
    assert slots.count() == 0 and tried == []
    # The reclaim pruned generation 0: the top and its release record stay.
    assert sorted(p.name for p in slots.dir.iterdir()) == ["_owner.json", "slot-0.1.json", "slot-0.1.json.released"]
    assert json.loads((slots.dir / "slot-0.1.json.released").read_text())["by"] == "reclaim"


def test_every_slot_function_runs_on_a_backend_without_rename(tmp_path):
    now = 1000.0
    store = MemoryBackend()
    slots = TargetSlots(tmp_path, "t", store=store)
    layout = StageLayout(tmp_path, "d", "r", "s")
    store.create_exclusive_json(layout.name(layout.claim(0, 0)), {"target": "t"})
    store.replace_json(layout.name(layout.status(0, 0)), {"state": "RUNNING", "alive_at": now - 1})
    live = slots.claim(3, holder_record(layout, 0, 0, now - 5))
    gone = slots.claim(3, holder_record(layout, 1, 0, now - 600))
    mine = slots.claim(3, {"who": "me"})
    assert (live[0], gone[0], mine[0]) == (0, 1, 2) and slots.claim(3, {"who": "more"}) is None
    assert slots.count() == 3 and slots.release(*mine) and slots.count() == 2
    freed = slots.reclaim_gone(now, skip=lambda holder: "who" in holder)
    assert [(index, why) for index, _, why in freed] == [(1, "attempt never launched")]
    assert slots.indexes() == [0] and slots.holders()[0]["subtask"] == 0
    assert slots.claim(3, {"who": "next"})[0] == 1
    assert not any(name.endswith(".tmp") for name in store.objects)


def test_counting_is_one_listing_without_reads(tmp_path):
    store = MemoryBackend()
    slots = TargetSlots(tmp_path, "t", store=store)
    for i in range(20):
        got = slots.claim(4, {"who": i})
        assert got is not None and slots.release(*got)
    slots.claim(4, {"who": "held"})
    store.reads = 0
    assert slots.count() == 1 and slots.indexes() == [0] and store.reads == 0


def test_racing_reclaimers_free_a_slot_once(tmp_path):
    now = 1000.0
    layout = StageLayout(tmp_path, "d", "r", "s")
    TargetSlots(tmp_path, "t").claim(1, holder_record(layout, 0, 0, now - 600))
    freed: list[Any] = []
    barrier = threading.Barrier(8)

    def reclaimer() -> None:
        slots = TargetSlots(tmp_path, "t")
        barrier.wait()
        freed.extend(slots.reclaim_gone(now))

    threads = [threading.Thread(target=reclaimer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(freed) == 1 and TargetSlots(tmp_path, "t").count() == 0


def _race_release_and_reclaim(root: Path, target: str, index: int, token: str, now: float) -> list[bool]:
    outcomes: list[bool] = []
    barrier = threading.Barrier(2)

    def release() -> None:
        barrier.wait()
        outcomes.append(TargetSlots(root, target).release(index, token))

    def reclaim() -> None:
        barrier.wait()
        outcomes.append(bool(TargetSlots(root, target).reclaim_gone(now)))

    threads = [threading.Thread(target=release), threading.Thread(target=reclaim)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_holder_release_racing_a_reclaim_has_one_winner(tmp_path):
    now = 1000.0
    layout = StageLayout(tmp_path, "d", "r", "s")
    for round_ in range(10):
        slots = TargetSlots(tmp_path, f"t{round_}")
        index, token = slots.claim(1, holder_record(layout, 0, 0, now - 600))
        assert sorted(_race_release_and_reclaim(tmp_path, f"t{round_}", index, token, now)) == [False, True]
        assert slots.count() == 0


def test_racing_claimers_of_a_released_slot_one_winner(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    for _ in range(3):
        assert slots.release(*slots.claim(1, {"who": "before"}))
    won: list[tuple[int, str]] = []
    barrier = threading.Barrier(12)

    def claimer(i: int) -> None:
        mine = TargetSlots(tmp_path, "t")
        barrier.wait()
        got = mine.claim(1, {"who": i})
        if got:
            won.append(got)

    _run_together(claimer, range(12))
    assert len(won) == 1 and slots.count() == 1 and slots.holders()[0]["token"] == won[0][1]


def test_a_claimer_with_a_stale_listing_never_takes_a_held_slot(tmp_path, monkeypatch):
    slots = TargetSlots(tmp_path, "t")
    stale = slots._generations()  # nothing claimed yet
    assert slots.claim(1, {"who": "first"}) is not None
    monkeypatch.setattr(slots, "_generations", lambda listing=None: stale)
    assert slots.claim(1, {"who": "late"}) is None
    monkeypatch.undo()
    assert slots.holders()[0]["who"] == "first"


def test_slot_k_json_is_generation_zero_and_other_names_are_ignored(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    create_exclusive_json(slots.dir / "slot-1.json", {"who": "old", "token": "abc"})
    (slots.dir / ".slot-0.json.0123.released").write_text("{}")  # hidden, not a claim or a release record
    (slots.dir / "slot-02.json").write_text("{}")  # not a name this module makes
    assert slots.indexes() == [1] and slots.holders() == {1: {"who": "old", "token": "abc"}}
    assert slots.claim(2, {"who": "new"})[0] == 0 and slots.claim(2, {"who": "more"}) is None
    assert slots.release(1, "abc") and slots.claim(2, {"who": "again"})[0] == 1
    assert (slots.dir / "slot-1.1.json").is_file()


# -- pruning ------------------------------------------------------------------------------------------


def test_releases_prune_every_generation_below_the_top(tmp_path):
    store = MemoryBackend()
    slots = TargetSlots(tmp_path, "t", store=store)
    for i in range(30):
        got = [slots.claim(2, {"who": i}), slots.claim(2, {"who": -i})]
        assert [index for index, _ in got] == [0, 1]
        assert all(slots.release(*held) for held in got)
        assert len(slots.store.children(slots.prefix)) <= 2 * 2 + 1
    assert slots.store.children(slots.prefix) == [
        "_owner.json", "slot-0.29.json", "slot-0.29.json.released", "slot-1.29.json", "slot-1.29.json.released"]
    held = slots.claim(2, {"who": "held"})
    # Held: the new top, and the released generation below it until this holder's release prunes it.
    assert held is not None and slots.count() == 1 and len(slots.store.children(slots.prefix)) == 6
    assert slots.release(*held) and len(slots.store.children(slots.prefix)) == 5


def test_a_claimer_recreating_a_pruned_name_gives_it_up_and_takes_the_top(tmp_path, monkeypatch):
    slots = TargetSlots(tmp_path, "t")
    assert slots.release(*slots.claim(1, {"who": "first"}))
    stale = slots._generations()  # generation 0, released
    for i in range(3):
        assert slots.release(*slots.claim(1, {"who": i}))
    assert not slots.path(0, 1).exists() and slots.path(0, 3).exists()  # generation 1 was pruned
    late = TargetSlots(tmp_path, "t")
    listings = [stale]
    monkeypatch.setattr(late, "_generations",
                        lambda listing=None: listings.pop() if listings else TargetSlots._generations(late))
    index, token = late.claim(1, {"who": "late"})
    # It created generation 1 again, saw generation 3 above it, gave it up and took generation 4.
    assert (index, slots.holders()[0]["token"], slots.holders()[0]["who"]) == (0, token, "late")
    assert sorted(p.name for p in slots.dir.iterdir()) == [
        "_owner.json", "slot-0.3.json", "slot-0.3.json.released", "slot-0.4.json"]
    assert slots.count() == 1 and late.release(index, token) and slots.count() == 0


def test_a_stale_pruning_never_deletes_a_top_or_a_kept_claim(tmp_path, monkeypatch):
    slots = TargetSlots(tmp_path, "t")
    assert slots.release(*slots.claim(1, {"who": "a"}))
    pruner = TargetSlots(tmp_path, "t")
    stale = pruner._listing()  # generation 0 is the top
    held = slots.claim(1, {"who": "b"})
    monkeypatch.setattr(pruner, "_listing", lambda: stale)
    assert pruner.prune() == 0
    monkeypatch.undo()
    assert slots.holders()[0]["token"] == held[1] and slots.release(*held)


def test_racing_claimers_releasers_reclaimers_and_pruners_never_oversubscribe(tmp_path):
    slots = 3
    race = race_slots(lambda: LateSlots(tmp_path, "t"), tmp_path, slots=slots, holders=8, rounds=15, crashers=3,
                      reclaimers=2, pruners=2, stale=3)
    assert race.errors == [] and race.failed_releases == 0
    assert 1 <= race.most <= slots and race.held == 8 * 15 + 3 and race.recreated >= 1
    final = TargetSlots(tmp_path, "t")
    names = final.store.children(final.prefix)
    assert final.count() == 0 and max(objects_per_slot(names).values()) <= 2 and len(names) <= 2 * slots + 1, names


def test_an_older_claim_is_generation_zero_released_and_pruned_as_any_other(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    create_exclusive_json(slots.dir / "slot-0.json", {"who": "older", "token": "abc"})
    assert slots.count() == 1 and slots.claim(1, {"who": "new"}) is None
    assert slots.release(0, "abc") and slots.release(*slots.claim(1, {"who": "new"}))
    assert sorted(p.name for p in slots.dir.iterdir()) == ["_owner.json", "slot-0.1.json", "slot-0.1.json.released"]


def test_a_slots_prefix_another_store_owns_is_used_but_never_pruned(tmp_path):
    theirs = PosixBackend(tmp_path, owner="another-store")
    slots = TargetSlots(tmp_path, "t")
    theirs.claim(slots.prefix)
    for i in range(3):
        assert slots.release(*slots.claim(1, {"who": i}))
    assert slots.prune() == 0 and len(list(slots.dir.iterdir())) == 1 + 2 * 3 and slots.count() == 0


# -- release without a listing --------------------------------------------------------------------------


def test_a_release_by_the_claiming_instance_is_one_create_and_its_deletes(tmp_path):
    store = MemoryBackend()
    slots = TargetSlots(tmp_path, "t", store=store)
    assert slots.release(*slots.claim(1, {"who": "first"}))
    held = slots.claim(1, {"who": "second"})
    store.ops.clear()
    assert slots.release(*held)
    # Its claim's listing showed generation 0 and its release record below it: deleted, claim first.
    # (The backend's own ownership check before a delete reads the prefix's marker once.)
    assert [op for op in store.ops.elements() if op[0] != "read_marker"] == [
        ("create_exclusive", f"{slots.prefix}/slot-0.1.json.released"),
        ("delete", f"{slots.prefix}/slot-0.json"), ("delete", f"{slots.prefix}/slot-0.json.released")]
    assert store.children(slots.prefix) == ["_owner.json", "slot-0.1.json", "slot-0.1.json.released"]
    assert slots.count() == 0


def test_a_release_after_a_restart_finds_its_generation_by_token(tmp_path):
    slots = TargetSlots(tmp_path, "t")
    assert slots.release(*slots.claim(1, {"who": "first"}))
    index, token = slots.claim(1, {"who": "second"})
    restarted = TargetSlots(tmp_path, "t")
    assert not restarted.release(index, "not-the-token") and slots.count() == 1
    assert restarted.release(index, token) and slots.count() == 0
    assert not slots.release(index, token)  # the claiming instance: released already, by the other one


def test_a_late_release_of_a_reclaimed_and_pruned_claim_frees_nothing(tmp_path):
    store = MemoryBackend()
    slots = TargetSlots(tmp_path, "t", store=store)
    old = slots.claim(1, {"who": "old"})
    # Presumed gone: reclaimed, then the slot taken and released twice, which prunes generation 0 away.
    assert slots._end(0, 0, {"by": "reclaim"})
    for who in ("a", "b"):
        assert slots.release(*TargetSlots(tmp_path, "t", store=store).claim(1, {"who": who}))
    current = TargetSlots(tmp_path, "t", store=store).claim(1, {"who": "current"})
    assert current is not None and "slot-0.json" not in store.children(slots.prefix)
    slots.release(*old)  # the old holder comes back: its record lands below the top
    assert slots.count() == 1 and slots.holders()[0]["who"] == "current"
    assert TargetSlots(tmp_path, "t", store=store).claim(1, {"who": "other"}) is None
    slots.prune()
    assert "slot-0.json.released" not in store.children(slots.prefix)
    assert slots.holders()[0]["token"] == current[1]


def test_a_claim_after_a_count_starts_from_its_listing_and_a_stale_one_never_hides_a_free_slot(tmp_path):
    store = MemoryBackend()
    slots = TargetSlots(tmp_path, "t", store=store)
    other = TargetSlots(tmp_path, "t", store=store)
    assert slots.count() == 0
    store.ops.clear()
    first = slots.claim(2, {"who": "first"})
    assert first is not None
    # (Its first claim also makes the prefix's ownership marker.)
    assert [op for op in store.ops.elements() if not op[1].endswith("_owner.json") and op[0] != "read_marker"] == [
        ("create_exclusive", f"{slots.prefix}/slot-0.json"), ("list", slots.prefix)]
    # A start from a listing that shows every slot held (stale: slot 0 was given back since) lists again
    # rather than answer None.
    taken = other.claim(2, {"who": "other"})
    assert taken is not None and taken[0] == 1
    assert slots.release(*first) and slots.count() == 1
    second = TargetSlots(tmp_path, "t", store=store)
    second._seen = {0: _held_slot(), 1: _held_slot()}
    assert second.claim(2, {"who": "second"})[0] == 0


def _held_slot() -> Any:
    """A listing entry of a slot whose generation 0 is held."""
    from airflow_provider_speculative.store.slots import _Slot

    return _Slot(claims={0})
