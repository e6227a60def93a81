"""The journal: every decision of a stage run, one JSON line each, always with a timestamp.

The only writer of ``journal.jsonl``: the controller, partition recovery, finalize, reruns and gc
all record through :func:`record` (or :func:`append`, the same on any store backend), so every line has
``at`` (epoch seconds) and ``event``, one of :class:`~airflow_provider_speculative.core.events.Event`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend

if TYPE_CHECKING:
    from airflow_provider_speculative.store.layout import StageLayout


def append(store: StoreBackend, name: str, event: Event, *, at: float | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event to the journal ``name`` of ``store``; return the record written."""
    # A plain string, so the record returned equals the one read back.
    line = {"at": time.time() if at is None else at, "event": str(event), **fields}
    store.append_record(name, line)
    return line


def _posix(path: str | Path) -> tuple[PosixBackend, str]:
    path = Path(os.fspath(path))
    return PosixBackend(path.parent), path.name


def record(path: str | Path, event: Event, *, at: float | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event to the journal at ``path``; return the line written."""
    return append(*_posix(path), event, at=at, **fields)


def record_stage(layout: StageLayout, event: Event, *, at: float | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event to the journal of ``layout``'s stage run in its store; return the record written."""
    return append(layout.store, layout.name(layout.journal), event, at=at, **fields)


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a journal (a torn last line is ignored)."""
    store, name = _posix(path)
    return store.read_journal(name)


class Journal:
    """A journal bound to one stage run and a clock (the controller's, which tests fake)."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time, **common: Any) -> None:
        self._bind(Path(os.fspath(path)), *_posix(path), clock, common)

    def _bind(self, path: Path, store: StoreBackend, name: str, clock: Callable[[], float],
              common: dict[str, Any]) -> None:
        self.path, self.store, self.name, self.clock, self.common = path, store, name, clock, common

    @classmethod
    def of_stage(cls, layout: StageLayout, clock: Callable[[], float] = time.time, **common: Any) -> Journal:
        """The journal of ``layout``'s stage run, appended to through the layout's store (its path never opened)."""
        journal = cls.__new__(cls)
        journal._bind(layout.journal, layout.store, layout.name(layout.journal), clock, common)
        return journal

    def __call__(self, event: Event, **fields: Any) -> dict[str, Any]:
        """Record ``event`` with this journal's common fields and the clock's time."""
        return append(self.store, self.name, event, at=self.clock(), **self.common, **fields)
