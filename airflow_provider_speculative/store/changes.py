"""Change notices: the writers of an attempt's state tell the controller which attempt changed.

A controller tick then polls the attempts named by new notices (plus a bounded, rotating share of the
others, as a safety net), instead of reading every live attempt's files every tick: the cost of a tick
follows what changed, not how many attempts are live. A notice is an empty object
``<stage>/changes/<subtask>.<attempt>.<unique>`` on the store's backend, created exclusively; unique names
mean a notice written while the controller reads is never deleted unread.

More than one controller can watch a stage for a while (a triggerer hand-over, an HA double run). So a
controller never deletes a notice as soon as it has read it, which would hide it from the other one until
its slower rotating poll: each :class:`NoticeReader` takes a notice once (it remembers the names it has
taken) and removes only notices it took at least a grace period ago, by then read by every controller
that steps at all. Removal is an owned delete (docs/store.md, "Run prefixes are owned"): in a run without
this store's marker the notices are simply left.

The path functions (:func:`notify`, :func:`pending`, :func:`any_pending`, :func:`acknowledge`) are the
same operations for writers that have a stage directory rather than a backend (supervisors, the runtime).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from airflow_provider_speculative.exceptions import StoreError, UnsafeStorePathError
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend, StoreNotOwnedError

DIRNAME = "changes"
# A controller removes a notice only this long after it first read it (and at least two of its check
# intervals): every other controller of the stage has listed the notices by then unless a single step of
# it lasted longer, and then it only learns of the change by its rotating poll, as without notices.
GRACE_SECONDS = 30.0


def prefix_of(stage: str) -> str:
    """The prefix of the notices of the stage whose store name is ``stage``."""
    return f"{stage}/{DIRNAME}" if stage else DIRNAME


def _parse(entry: str) -> tuple[int, int] | None:
    if entry.endswith("/"):
        return None  # a sub-prefix: not a notice
    parts = entry.split(".")
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    return None


def post(store: StoreBackend, stage: str, subtask: int, attempt: int) -> None:
    """Record that attempt ``attempt`` of ``subtask`` changed; best effort (polling is the safety net)."""
    with contextlib.suppress(StoreError, OSError):
        store.create_exclusive(f"{prefix_of(stage)}/{subtask}.{attempt}.{uuid.uuid4().hex[:16]}", b"")


def listed(store: StoreBackend, stage: str) -> dict[str, tuple[int, int]]:
    """The notices present now: store name -> the (subtask, attempt) it names (one listing of the prefix)."""
    prefix = prefix_of(stage)
    found = {}
    for entry in store.children(prefix):
        key = _parse(entry)
        if key is not None:
            found[f"{prefix}/{entry}"] = key
    return found


def remove(store: StoreBackend, names: Iterable[str]) -> bool:
    """Remove notices by owned delete; False (all left) when refused: no marker of this store, or a link."""
    try:
        store.delete_many(names)
    except (StoreNotOwnedError, UnsafeStorePathError):
        return False
    return True


class NoticeReader:
    """One controller's reading of a stage's notices: each taken once, removed a grace period after it was read.

    A step calls :meth:`take` before polling and :meth:`acknowledge` once the attempts are polled: only then do
    the notices count as read, so a step that fails in between finds them new again.
    """

    def __init__(self, store: StoreBackend, stage: str, clock: Callable[[], float],
                 grace: float = GRACE_SECONDS) -> None:
        self.store, self.stage, self.clock, self.grace = store, stage, clock, grace
        # Notices present at the last acknowledged take: name -> when this reader read it (or last failed to
        # remove it). Names no longer listed are dropped, so it holds at most a grace period's notices.
        self._read: dict[str, float] = {}
        self._taken: dict[str, tuple[int, int]] | None = None

    def changed(self) -> bool:
        """True if a notice this reader has not read yet is present (one listing of the notices' prefix)."""
        return any(name not in self._read for name in listed(self.store, self.stage))

    def take(self) -> set[tuple[int, int]]:
        """The attempts named by the notices this reader has not read yet (read once :meth:`acknowledge` runs)."""
        self._taken = listed(self.store, self.stage)
        return {key for name, key in self._taken.items() if name not in self._read}

    def acknowledge(self) -> int:
        """Count the last take as read; remove the notices read at least ``grace`` ago; the number removed."""
        now = self.clock()
        if self._taken is not None:
            # Names missing from the listing were removed by this reader or another one: forgotten.
            self._read = {name: self._read.get(name, now) for name in self._taken}
            self._taken = None
        due = [name for name, at in self._read.items() if now - at >= self.grace]
        if not due:
            return 0
        if not remove(self.store, due):
            for name in due:  # left in place; asked again a grace period later, not on every step
                self._read[name] = now
            return 0
        for name in due:
            del self._read[name]
        return len(due)


# -- by path: for the writers that have a stage directory ---------------------------------------------------


def _stage_store(stage_dir: str | Path) -> tuple[PosixBackend, str]:
    """The store a stage directory ``<root>/<dag>/<run>/<stage>`` is in, and the stage's name there."""
    path = Path(os.fspath(stage_dir))
    if len(path.parts) < 4:
        return PosixBackend(path), ""  # not below a store root: its notices, but no owned delete
    return PosixBackend(path.parents[2]), "/".join(path.parts[-3:])


def notify(stage_dir: str | Path, subtask: int, attempt: int) -> None:
    """Record that attempt ``attempt`` of ``subtask`` changed; best effort (polling is the safety net)."""
    with contextlib.suppress(StoreError, OSError):
        store, stage = _stage_store(stage_dir)
        post(store, stage, subtask, attempt)


def pending(stage_dir: str | Path) -> tuple[set[tuple[int, int]], list[str]]:
    """The attempts named by the notices present now, and the notice paths (to :func:`acknowledge`)."""
    store, stage = _stage_store(stage_dir)
    found = listed(store, stage)
    return set(found.values()), [str(store.path(name)) for name in found]


def any_pending(stage_dir: str | Path) -> bool:
    """True if at least one notice is waiting."""
    store, stage = _stage_store(stage_dir)
    return bool(listed(store, stage))


def acknowledge(names: list[str]) -> None:
    """Remove notices (paths :func:`pending` returned) by owned delete; left where the run has no marker."""
    by_store: dict[Path, list[str]] = {}
    for name in names:
        path = Path(os.fspath(name))
        by_store.setdefault(path.parents[4] if len(path.parts) >= 6 else path.parents[1], []).append(path.as_posix())
    for root, paths in by_store.items():
        store = PosixBackend(root)
        remove(store, [store.name_of(p) for p in paths])
