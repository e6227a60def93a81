"""The journal: every decision of a stage run, one JSON line each, always with a timestamp.

The only writer of ``journal.jsonl``: the controller, partition recovery, finalize, reruns and gc
all record through :func:`record`, so every line has ``at`` (epoch seconds) and ``event``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.store.files import append_jsonl, read_jsonl


def record(path: str | Path, event: str, *, at: float | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event to the journal at ``path``; return the line written."""
    line = {"at": time.time() if at is None else at, "event": event, **fields}
    append_jsonl(path, line)
    return line


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a journal (a torn last line is ignored)."""
    return read_jsonl(path)


class Journal:
    """A journal bound to one stage run and a clock (the controller's, which tests fake)."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time, **common: Any) -> None:
        self.path = Path(path)
        self.clock = clock
        self.common = common

    def __call__(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record ``event`` with this journal's common fields and the clock's time."""
        return record(self.path, event, at=self.clock(), **self.common, **fields)
