"""Slot claims of a target, shared by every stage and DAG run using it: ``<store>/_targets/<target>/slots/``.

Slot ``k`` has generations ``g = 0, 1, 2, ...``. A **claim** of generation ``g`` is the object
``slot-<k>.json`` (``g = 0``: any ``slot-<k>.json`` in a store is one) or ``slot-<k>.<g>.json``, created exclusively;
its record names the holder's attempt (dag, run, stage, subtask, attempt) and a random token. A
**release record** ``<claim>.released`` is created exclusively next to a claim and ends it for good.
Slot ``k`` is held while its **top** (its highest generation present) has no release record. Nothing is
renamed or replaced: the scheme needs exclusive create, listing and owned deletes, which every store
backend gives:

* taking a free slot creates generation ``g + 1`` once the top ``g`` is seen released (``0`` when the slot
  has none): of racing claimers exactly one creates it. The claimer then lists again and keeps the slot
  only if no generation above its own is there; otherwise it releases its own and tries again on a
  fresh listing (a claimer with a stale listing may have created a name that was pruned);
* the holder releases its slot by creating the release record of its own generation: the generation its
  claim kept, remembered by the instance that claimed (no listing, no read), or, after a restart, the
  slot's top found by a listing whose claim carries its token;
* a slot whose holder is provably gone (``core.slots.holder_gone``) is reclaimed by creating the same
  release record: of two reclaimers, or of a reclaimer and the holder, exactly one wins, and a later
  generation (a new holder's claim) is never touched.

**Pruning.** Whoever creates a release record (holder, reclaimer, or a claimer giving up) then lists the
prefix and deletes, for every slot, each claim and release record of a generation below that listing's
top, each claim before its release record; the top and its release record stay. Why at most one
claimer keeps a slot: (a) a pruning deletes only names below a generation its listing showed, so the
highest generation ever created is never deleted and, once a name is pruned, a higher generation exists
for good; (b) so a claimer that creates a pruned name again sees a higher one in its second listing and
gives up: a kept claim is the first object of its name and its slot's top; (c) a later generation is
created only once a listing shows the kept claim's release record, which only its holder's release or a
reclaim creates (a release record is made only for a claim that exists or was read, so none predates
the first object of its name). Hence a kept claim stays its slot's top, never pruned, until released or
reclaimed, and whatever a pruning deletes is released, superseded or being given up. This takes a
listing to show the prefix as it was at one moment, as one ``getdents`` of a small directory or one page
of ``ListObjectsV2`` does; pruning keeps the prefix that small.

**Release without a listing.** A holder that claimed in this instance knows its generation ``g`` and what
its claim's second listing showed below ``g`` in its slot. It creates ``g``'s release record, then deletes
those names (each claim before its release record) and lists nothing: a pruning by (a), since that listing
showed ``g``. If the create fails, a reclaim ended the claim first (False). If the claim was reclaimed and
both it and its record pruned since, the create makes a record below the slot's top: the top never falls
back to ``g`` by (a), so the record ends no claim that could be kept (a claim of ``g`` made again is given up
by (b)), and the next pruning deletes it; the release then reports True, which only its caller's count sees.
Names below ``g`` that appeared after that listing (a claimer giving up a stale generation) are pruned by
whoever made them. What a crash leaves between the create and the deletes is seen by the slot's next
holder's claim listing and deleted at its release.

Cost: counting held slots is one listing of the slots prefix, without reads; a claim is a listing, a create
and a listing, or only the create and the listing when it starts from the instance's last count or kept claim
(a listing nothing the instance did since has changed: a stale start costs a failed create or a given-up
generation, never a second holder); a release by the claiming instance is a create and (usually two) deletes;
the prefix holds at most
three objects per slot once races settle (a held top, and the released generation below it until its
holder's release prunes it), plus its ownership marker (``_owner.json``, made by ``StoreBackend.claim``
on an instance's first claim or pruning). Holders are read only when a stage wants a slot, finds none free and a
reclaim is due. A store whose slots prefix is owned by another store (another root URL) is not pruned.

**Older layout.** Controllers before this scheme only ever made ``slot-<k>.json`` and released it by
renaming it away; such a claim with no release record is read here as generation 0, held, and is
released or reclaimed as any other. The two schemes must not share a store while slots are held: the
older one does not see generations above 0 and may take back a pruned ``slot-<k>.json``.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.slots import holder_gone
from airflow_provider_speculative.store.backend import StoreBackend, StoreNotOwnedError
from airflow_provider_speculative.store.layout import StageLayout, safe_component, store_at

TARGETS_DIR = "_targets"
RELEASED_SUFFIX = ".released"
_ENTRY = re.compile(r"^slot-(\d+)(?:\.(\d+))?\.json(\.released)?$")
# Fresh listings a claimer tries after giving up a generation it created from a stale one.
_CLAIM_ROUNDS = 4


@dataclass
class _Slot:
    """What one listing shows of one slot: its claims' and its release records' generations."""

    claims: set[int] = field(default_factory=set)
    released: set[int] = field(default_factory=set)

    @property
    def top(self) -> int:
        """The highest generation claimed (-1 for none)."""
        return max(self.claims, default=-1)

    @property
    def free(self) -> bool:
        """Whether the slot is free: no claim, or its top released."""
        return not self.claims or self.top in self.released


class TargetSlots:
    """The slot claims of one target in one store."""

    def __init__(self, root: Path, target: str, store: StoreBackend | None = None) -> None:
        # A layout's root: a POSIX directory, or a StorePath whose store is the one its URL was opened as.
        self.root = root if isinstance(root, Path) else Path(root)
        self.target = target
        self.store: StoreBackend = store_at(self.root) if store is None else store
        self.prefix = f"{TARGETS_DIR}/{safe_component(target)}/slots"
        self.dir = self.root / self.prefix
        self._owned: bool | None = None  # None: not claimed yet by this instance
        # (index, token) -> (generation, the names below it its claim's own listing showed): what this
        # instance's own release needs, so that it neither lists nor reads the claim back.
        self._kept: dict[tuple[int, str], tuple[int, list[str]]] = {}
        # The last listing this instance made that nothing it did since has changed (a count, or a kept
        # claim's second listing): the next claim starts from it instead of listing again.
        self._seen: dict[int, _Slot] | None = None

    def path(self, index: int, generation: int = 0) -> Path:
        """The claim file of slot ``index`` (of its ``generation``) in a POSIX store."""
        return self.dir / self.name(index, generation)

    @staticmethod
    def name(index: int, generation: int = 0) -> str:
        """The claim's name within the slots prefix."""
        return f"slot-{index}.json" if generation == 0 else f"slot-{index}.{generation}.json"

    def _object(self, index: int, generation: int, *, released: bool = False) -> str:
        return f"{self.prefix}/{self.name(index, generation)}{RELEASED_SUFFIX if released else ''}"

    def _listing(self) -> dict[int, _Slot]:
        """Slot index -> its claims and release records, from one listing."""
        slots: dict[int, _Slot] = {}
        for entry in self.store.children(self.prefix):
            match = _ENTRY.match(entry)
            if match is None:
                continue
            index, generation = int(match.group(1)), int(match.group(2) or 0)
            if entry != self.name(index, generation) + (match.group(3) or ""):
                continue  # ``slot-01.json``, ``slot-1.0.json``: not a name this module makes
            slot = slots.setdefault(index, _Slot())
            (slot.released if match.group(3) else slot.claims).add(generation)
        return slots

    def _generations(self, listing: dict[int, _Slot] | None = None) -> dict[int, tuple[int, bool]]:
        """Slot index -> (its top generation, whether that one is released), from one listing."""
        listing = self._listing() if listing is None else listing
        return {index: (slot.top, slot.free) for index, slot in listing.items() if slot.claims}

    def _held(self) -> dict[int, int]:
        """Slot index -> the generation holding it."""
        return {index: generation for index, (generation, done) in self._generations().items() if not done}

    def indexes(self) -> list[int]:
        """Indexes of the slots held now (one listing, no read)."""
        return sorted(self._held())

    def count(self) -> int:
        """How many slots are held now, by any stage or run (the listing is kept for this instance's next claim)."""
        self._seen = self._listing()
        return sum(1 for slot in self._seen.values() if not slot.free)

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
        token = uuid.uuid4().hex
        self._own()  # the prefix's marker before its first claim, so that releases may prune there
        for _ in range(_CLAIM_ROUNDS):
            gave_up = False
            # A stale start costs only a failed create or a given-up generation (module docstring), or a
            # second round if it showed nothing free; it is what this instance saw last, with nothing it did since.
            seen, self._seen = self._seen, None
            generations = self._generations(seen)
            for index in range(capacity):
                top, free = generations.get(index, (-1, True))
                if not free:
                    continue
                generation = top + 1
                if not self.store.create_exclusive_json(self._object(index, generation), {**holder, "token": token}):
                    continue
                listing = self._listing()
                slot = listing.get(index, _Slot())
                if slot.top == generation and not slot.free:
                    self._kept[(index, token)] = (generation, self._below(index, slot, generation))
                    self._seen = listing
                    return index, token
                # Not the top, or ended already: our first listing was stale and our name may be one already pruned.
                self._end(index, generation, {"token": token, "by": "claimer", "at": time.time()})
                self.prune()
                gave_up = True
                break
            if not gave_up and seen is None:
                return None
            # Nothing free in a kept listing, or a generation given up: ask a fresh listing before saying None.
        return None

    def release(self, index: int, token: str) -> bool:
        """End our claim of slot ``index`` (its token); True if it was ours and not reclaimed already.

        A claim this instance made is released by one create and pruned by the deletes its claim's own
        listing called for, with no listing or read (module docstring, "Release"); one restored from the
        store after a restart is looked up first.
        """
        self._seen = None
        kept = self._kept.pop((index, token), None)
        if kept is not None:
            generation, below = kept
            if not self._end(index, generation, {"token": token, "by": "holder", "at": time.time()}):
                return False  # reclaimed already: its release record is there
            if below and self._own():
                for name in below:
                    self.store.delete(f"{self.prefix}/{name}")
            return True
        generation, released = self._generations().get(index, (-1, True))
        if released:
            return False
        record = self.store.read_json(self._object(index, generation))
        if not isinstance(record, dict) or record.get("token") != token:
            return False  # reclaimed already (we were presumed gone): the slot is someone else's now
        ended = self._end(index, generation, {"token": token, "by": "holder", "at": time.time()})
        if ended:
            self.prune()
        return ended

    def _below(self, index: int, slot: _Slot, generation: int) -> list[str]:
        """The names of ``slot`` below ``generation`` in one listing, each claim before its release record."""
        names = []
        for below in sorted((slot.claims | slot.released) - {generation}):
            if below > generation:
                continue
            if below in slot.claims:
                names.append(self.name(index, below))
            if below in slot.released:
                names.append(self.name(index, below) + RELEASED_SUFFIX)
        return names

    def _end(self, index: int, generation: int, record: dict[str, Any]) -> bool:
        """Create the release record of one generation: True for the one caller that did."""
        self._seen = None
        return self.store.create_exclusive_json(self._object(index, generation, released=True), record)

    def reclaim_gone(self, now: float, skip: Callable[[dict[str, Any]], bool] = lambda holder: False,
                     ) -> list[tuple[int, dict[str, Any], str]]:
        """Free the slots whose holders are provably gone (except ``skip``-ped ones); return (index, holder, why)."""
        freed = []
        ended = False
        for index, (generation, holder) in self._holder_claims().items():
            if skip(holder):
                continue
            why = self._gone(holder, now)
            if why and self._end(index, generation, {"token": holder.get("token"), "by": "reclaim", "at": now,
                                                     "why": why}):
                ended = True
                # A claim pruned and its name taken again since our read was not the holder's: not freed by us.
                claim = self.store.read_json(self._object(index, generation))
                if isinstance(claim, dict) and claim.get("token") == holder.get("token"):
                    freed.append((index, holder, why))
        if ended:
            self.prune()
        return freed

    def prune(self) -> int:
        """Delete every claim and release record below its slot's top (module docstring); return how many went."""
        self._seen = None
        if not self._own():
            return 0
        deleted = 0
        for index, slot in sorted(self._listing().items()):
            # A release record above every claim this listing shows is left: its claim was missed. The claim
            # goes before its release record: no release record is deleted while its claim is still there, so
            # a reclaimer that finds the claim it read still there after creating the record knows its record
            # was the first.
            for name in self._below(index, slot, slot.top):
                if self.store.delete(f"{self.prefix}/{name}"):
                    deleted += 1
        return deleted

    def _own(self) -> bool:
        """Own the slots prefix (once per instance) so that pruning may delete there; False if another store does."""
        if self._owned is None:
            try:
                self.store.claim(self.prefix)
                self._owned = True
            except StoreNotOwnedError:
                self._owned = False  # the prefix is another store's (another root URL): leave it unpruned
        return self._owned

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
