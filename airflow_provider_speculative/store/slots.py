"""Slot claims of a target, shared by every stage and DAG run using it: ``<store>/_targets/<target>/slots/``.

Slot ``k`` has generations ``g = 0, 1, 2, ...``. A **claim** of generation ``g`` is the object
``slot-<k>.json`` (``g = 0``: any ``slot-<k>.json`` in a store is one) or ``slot-<k>.<g>.json``, created exclusively;
its record names the holder's attempt (dag, run, stage, subtask, attempt) and a random token. A
**release record** ``<claim>.released`` is created exclusively next to a claim and ends it for good.
Slot ``k`` is held while its highest generation has no release record. Nothing is renamed, replaced or
deleted, so the scheme needs only exclusive create and listing, which every store backend gives:

* taking a free slot creates generation ``g + 1`` once generation ``g`` is seen released (``0`` when
  the slot has none): of racing claimers exactly one creates it, and a claimer with a stale listing
  finds its generation taken. A generation is created only after the one below it was released, so
  at most one generation of a slot is ever unreleased, and it is the highest;
* the holder releases its slot by creating the release record of its own generation (found by its token);
* a slot whose holder is provably gone (``core.slots.holder_gone``) is reclaimed by creating the same
  release record: of two reclaimers, or of a reclaimer and the holder, exactly one wins, and a later
  generation (a new holder's claim) is never touched.

Cost: counting held slots is one listing of the slots prefix, linear in its objects and without reads;
holders are read only when a stage wants a slot, finds none free and a reclaim is due. Released
generations stay (two objects per use of a slot) until the store's owned deletes can prune them; a
pruning must keep each slot's highest generation and its release record, and a claimer must then list
again after its create and give up a generation below another, since a deleted name can be created anew.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.slots import holder_gone
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.layout import StageLayout, safe_component

TARGETS_DIR = "_targets"
RELEASED_SUFFIX = ".released"
_ENTRY = re.compile(r"^slot-(\d+)(?:\.(\d+))?\.json(\.released)?$")


class TargetSlots:
    """The slot claims of one target in one store."""

    def __init__(self, root: Path, target: str, store: StoreBackend | None = None) -> None:
        self.root = Path(root)
        self.target = target
        self.store: StoreBackend = PosixBackend(self.root) if store is None else store
        self.prefix = f"{TARGETS_DIR}/{safe_component(target)}/slots"
        self.dir = self.root / self.prefix

    def path(self, index: int, generation: int = 0) -> Path:
        """The claim file of slot ``index`` (of its ``generation``) in a POSIX store."""
        return self.dir / self.name(index, generation)

    @staticmethod
    def name(index: int, generation: int = 0) -> str:
        """The claim's name within the slots prefix."""
        return f"slot-{index}.json" if generation == 0 else f"slot-{index}.{generation}.json"

    def _object(self, index: int, generation: int, *, released: bool = False) -> str:
        return f"{self.prefix}/{self.name(index, generation)}{RELEASED_SUFFIX if released else ''}"

    def _generations(self) -> dict[int, tuple[int, bool]]:
        """Slot index -> (its highest generation, whether that one is released), from one listing."""
        claims: dict[int, int] = {}
        released: set[tuple[int, int]] = set()
        for entry in self.store.children(self.prefix):
            match = _ENTRY.match(entry)
            if match is None:
                continue
            key = (int(match.group(1)), int(match.group(2) or 0))
            if entry != self.name(*key) + (match.group(3) or ""):
                continue  # ``slot-01.json``, ``slot-1.0.json``: not a name this module makes
            if match.group(3):
                released.add(key)
            else:
                claims[key[0]] = max(key[1], claims.get(key[0], -1))
        return {index: (generation, (index, generation) in released) for index, generation in claims.items()}

    def _held(self) -> dict[int, int]:
        """Slot index -> the generation holding it."""
        return {index: generation for index, (generation, done) in self._generations().items() if not done}

    def indexes(self) -> list[int]:
        """Indexes of the slots held now (one listing, no read)."""
        return sorted(self._held())

    def count(self) -> int:
        """How many slots are held now, by any stage or run."""
        return len(self._held())

    def holders(self) -> dict[int, dict[str, Any]]:
        """Slot index -> holder record (reads each claim: used for reclaims and the status view only)."""
        return {index: record for index, (_, record) in self._holder_claims().items()}

    def _holder_claims(self) -> dict[int, tuple[int, dict[str, Any]]]:
        out = {}
        for index, generation in sorted(self._held().items()):
            record = self.store.read_json(self._object(index, generation))
            if isinstance(record, dict):
                out[index] = (generation, record)
        return out

    def claim(self, capacity: int, holder: dict[str, Any]) -> tuple[int, str] | None:
        """Take the lowest free slot below ``capacity``; return (index, token), or None if all are held."""
        generations = self._generations()
        token = uuid.uuid4().hex
        for index in range(capacity):
            generation, released = generations.get(index, (-1, True))
            if not released:
                continue
            if self.store.create_exclusive_json(self._object(index, generation + 1), {**holder, "token": token}):
                return index, token
        return None

    def release(self, index: int, token: str) -> bool:
        """End our claim of slot ``index`` (its token); True if it was ours and not reclaimed already."""
        generation, released = self._generations().get(index, (-1, True))
        if released:
            return False
        record = self.store.read_json(self._object(index, generation))
        if not isinstance(record, dict) or record.get("token") != token:
            return False  # reclaimed already (we were presumed gone): the slot is someone else's now
        return self._end(index, generation, {"token": token, "by": "holder", "at": time.time()})

    def _end(self, index: int, generation: int, record: dict[str, Any]) -> bool:
        """Create the release record of one generation: True for the one caller that did."""
        return self.store.create_exclusive_json(self._object(index, generation, released=True), record)

    def reclaim_gone(self, now: float, skip: Callable[[dict[str, Any]], bool] = lambda holder: False,
                     ) -> list[tuple[int, dict[str, Any], str]]:
        """Free the slots whose holders are provably gone (except ``skip``-ped ones); return (index, holder, why)."""
        freed = []
        for index, (generation, holder) in self._holder_claims().items():
            if skip(holder):
                continue
            why = self._gone(holder, now)
            if why and self._end(index, generation, {"token": holder.get("token"), "by": "reclaim", "at": now,
                                                     "why": why}):
                freed.append((index, holder, why))
        return freed

    def _gone(self, holder: dict[str, Any], now: float) -> str | None:
        try:
            layout = StageLayout(self.root, str(holder["dag_id"]), str(holder["run_id"]), str(holder["stage"]))
            subtask, attempt = int(holder["subtask"]), int(holder["attempt"])
        except (KeyError, TypeError, ValueError):
            return "unreadable holder record"
        status = self.store.read_json(layout.name(layout.status(subtask, attempt)))
        return holder_gone(holder, status, self.store.exists(layout.name(layout.claim(subtask, attempt))), now)


def holder_record(layout: StageLayout, subtask: int, attempt: int, now: float) -> dict[str, Any]:
    """What a slot claim says about its holder (enough to find its attempt's status)."""
    return {"dag_id": layout.dag_id, "run_id": layout.run_id, "stage": layout.stage, "subtask": subtask,
            "attempt": attempt, "claimed_at": now}
