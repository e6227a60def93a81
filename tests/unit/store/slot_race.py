"""A race on one target's slots, written once for every backend: claimers, releasers, reclaimers and pruners.

Live holders register in a shared map while they believe they hold a slot; the map never has two holders
of one slot nor more than ``slots`` entries. Crashed holders claim and vanish; reclaimers free their slots.
Some claimers list late (a pause between their listing and their create), and stale claimers keep one
listing of slot 0 free until the name it gives them has been created and pruned, then claim with it:
they create a pruned name again, the hazard pruning must survive.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.slots import TargetSlots, holder_record

NOW = 1000.0
# Crashed holders claimed long ago and never launched: provably gone at NOW. Live ones claimed at NOW.
GONE_AT = NOW - 600


class LateSlots(TargetSlots):
    """Slots whose first listing of a claim or release is, now and then, stale when used (a pause after it)."""

    pause = 0.01
    chance = 0.5

    def _generations(self, listing: Any = None) -> dict[int, tuple[int, bool]]:
        seen = super()._generations(listing)
        if random.random() < self.chance:
            time.sleep(random.uniform(self.pause / 2, self.pause))
        return seen


@dataclass
class Race:
    """What the race saw: the most holders at once, holdings, releases that failed, errors, pruned names made again."""

    most: int = 0
    held: int = 0
    failed_releases: int = 0
    errors: list[BaseException] = field(default_factory=list)
    recreated: int = 0


def race_slots(make_slots: Callable[[], TargetSlots], root: Path, *, slots: int, holders: int, rounds: int,
               crashers: int, reclaimers: int = 1, pruners: int = 1, stale: int = 0) -> Race:
    """Run the race to its end (every live holder done, every crashed holder's slot reclaimed)."""
    race = Race()
    lock = threading.Lock()
    holding: dict[int, int] = {}
    done, holders_done = threading.Event(), threading.Event()
    layout = StageLayout(root, "d", "r", "s")

    def guarded(body: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            try:
                body(*args)
            except BaseException as exc:  # collected: the test fails with it
                with lock:
                    race.errors.append(exc)
        return run

    def hold(mine: TargetSlots, i: int, got: tuple[int, str]) -> None:
        index, token = got
        with lock:
            assert index not in holding, f"slot {index} held by {holding[index]} and {i}"
            holding[index] = i
            race.most = max(race.most, len(holding))
            race.held += 1
        time.sleep(random.uniform(0, 0.003))
        with lock:
            del holding[index]
        if not mine.release(index, token):
            with lock:
                race.failed_releases += 1

    def holder(i: int) -> None:
        mine = make_slots()
        for round_ in range(rounds):
            got = None
            while got is None and not race.errors:
                got = mine.claim(slots, holder_record(layout, i, round_, NOW))
                if got is None:
                    time.sleep(0.001)
            if got is None:
                return
            hold(mine, i, got)

    def stale_claimer(i: int) -> None:
        mine = make_slots()
        listing = TargetSlots._generations(mine)
        while not listing.get(0, (-1, True))[1] and not holders_done.is_set():
            listing = TargetSlots._generations(mine)
        generation = listing.get(0, (-1, True))[0] + 1
        name = mine._object(0, generation)
        while not holders_done.is_set():  # until the name this listing gives is superseded and pruned
            now = TargetSlots._listing(mine).get(0)
            if now is not None and now.top > generation and generation not in now.claims:
                break
            time.sleep(0.001)
        created = mine.store.create_exclusive_json
        listings = [listing]

        def create(what: str, obj: Any) -> bool:
            won = created(what, obj)
            if won and what == name:
                with lock:
                    race.recreated += 1
            return won

        mine.store.create_exclusive_json = create  # type: ignore[method-assign,assignment]
        mine._generations = lambda listing=None: listings.pop() if listings else TargetSlots._generations(mine)  # type: ignore[method-assign]
        got = None
        while got is None and not race.errors:
            got = mine.claim(slots, holder_record(layout, holders + i, 0, NOW))
            if got is None:
                time.sleep(0.001)
        if got is not None:
            hold(mine, holders + i, got)

    def crasher(i: int) -> None:
        mine = make_slots()
        while mine.claim(slots, holder_record(layout, holders + stale + i, 0, GONE_AT)) is None and not done.is_set():
            time.sleep(0.002)

    def background(work: Callable[[TargetSlots], Any]) -> Callable[[], None]:
        def loop() -> None:
            mine = make_slots()
            while not done.is_set():
                work(mine)
                time.sleep(random.uniform(0, 0.003))
        return loop

    workers = [threading.Thread(target=guarded(holder), args=(i,)) for i in range(holders)]
    late = [threading.Thread(target=guarded(stale_claimer), args=(i,)) for i in range(stale)]
    late += [threading.Thread(target=guarded(crasher), args=(i,)) for i in range(crashers)]
    helpers = [threading.Thread(target=guarded(background(lambda s: s.reclaim_gone(NOW)))) for _ in range(reclaimers)]
    helpers += [threading.Thread(target=guarded(background(lambda s: s.prune()))) for _ in range(pruners)]
    for thread in workers + late + helpers:
        thread.start()
    for thread in workers:
        thread.join()
    holders_done.set()
    for thread in late[:stale]:
        thread.join()
    done.set()
    for thread in late[stale:]:
        thread.join()
    for thread in helpers:
        thread.join()
    last = make_slots()
    last.reclaim_gone(NOW)
    last.prune()
    return race


def objects_per_slot(names: list[str]) -> dict[str, int]:
    """``slot-<k>`` -> how many of ``names`` (entries of a slots prefix) belong to it."""
    out: dict[str, int] = {}
    for name in names:
        if name.startswith("slot-"):
            key = name.split(".", 1)[0]
            out[key] = out.get(key, 0) + 1
    return out
