"""The target slots one stage run holds in the store (FLIP-159): claimed at launch, released at the end.

Slots belong to the target, not to a stage: every stage and DAG run using a target claims them in
``<store>/_targets/<target>/slots/`` (``store/slots.py``). This ledger is one stage run's side of
that: which of its attempts hold which slot, giving them back once the attempts are over, and freeing
slots of holders that are provably gone when the stage waits for one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.slots import TargetView
from airflow_provider_speculative.core.states import TERMINAL, Attempt
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.slots import TargetSlots, holder_record

# A stage that wants a slot and finds none free looks for holders that are provably gone this often.
RECLAIM_PERIOD = 10.0

Key = tuple[int, int]


class SlotLedger:
    """The slots of one stage run's attempts: (subtask, attempt) -> (target, slot index, token)."""

    def __init__(self, layout: StageLayout, config: SpeculativeConfig, journal: Callable[..., Any]) -> None:
        self.layout = layout
        self.journal = journal
        self.stores = {t.name: TargetSlots(layout.root, t.name, layout.store) for t in config.targets}
        self.held: dict[Key, tuple[str, int, str]] = {}
        self._reclaim_at = float("-inf")

    def owns(self, holder: Mapping[str, Any]) -> bool:
        """Whether a slot holder record is one of this stage run's attempts."""
        return (holder.get("dag_id"), holder.get("run_id"), holder.get("stage")) == (
            self.layout.dag_id, self.layout.run_id, self.layout.stage)

    def restore(self) -> None:
        """Take back the slots this stage run held before a restart: O(slots) per target, read once."""
        for name, store in self.stores.items():
            for index, holder in store.holders().items():
                if self.owns(holder):
                    self.held[(int(holder["subtask"]), int(holder["attempt"]))] = (name, index, str(holder["token"]))

    def claim(self, target: str, capacity: int, key: Key, now: float) -> tuple[int, str] | None:
        """Claim a slot of ``target`` for an attempt about to launch; None if another holder took the last."""
        slot = self.stores[target].claim(capacity, holder_record(self.layout, key[0], key[1], now))
        if slot is not None:
            self.held[key] = (target, *slot)
        return slot

    def release(self, key: Key) -> None:
        """Give back one attempt's slot (its launch was lost, or it is over)."""
        held = self.held.pop(key, None)
        if held is not None:
            target, index, token = held
            self.stores[target].release(index, token)

    def release_over(self, attempts: Mapping[int, Mapping[int, Attempt]], reaping: set[Key], decided: bool,
                     ) -> dict[str, int]:
        """Give back the slots of attempts that are over; returns how many per target. O(held), held <= slots.

        Over: terminal and not being reaped; once the stage is decided, every attempt no longer reaped
        (the scheduler stops observing then, so a reaped loser stays CANCELING in its state).
        """
        released: dict[str, int] = {}
        for key in list(self.held):
            attempt = attempts.get(key[0], {}).get(key[1])
            if key not in reaping and (attempt is None or attempt.state in TERMINAL or decided):
                target = self.held[key][0]
                self.release(key)
                released[target] = released.get(target, 0) + 1
        return released

    def release_gone(self, keys: Iterable[Key], live: Callable[[Key], bool]) -> None:
        """Give back the slots of ``keys`` whose attempts are not live (after a kill)."""
        for key in [k for k in keys if k in self.held]:
            if not live(key):
                self.release(key)

    def reclaim(self, views: dict[str, TargetView], waiting: bool, now: float) -> None:
        """While the stage waits for a slot: free slots of gone holders on targets with none free (in ``views``)."""
        starved = [name for name, v in views.items() if v.capacity > 0 and v.free == 0]
        if not (starved and waiting and now - self._reclaim_at >= RECLAIM_PERIOD):
            return
        self._reclaim_at = now
        for name in starved:
            # This stage's own slots are released by release_over once it sees the attempt end.
            for index, holder, why in self.stores[name].reclaim_gone(now, skip=self.owns):
                self.journal(Event.SLOT_RECLAIMED, target=name, slot=index, why=why,
                             holder={k: holder.get(k) for k in ("dag_id", "run_id", "stage", "subtask", "attempt")})
                views[name] = replace(views[name], held=views[name].held - 1)
