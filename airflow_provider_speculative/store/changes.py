"""Change notices: the writers of an attempt's state tell the controller which attempt changed.

A controller tick then polls the attempts named by new notices (plus a bounded, rotating share of the
others, as a safety net), instead of reading every live attempt's files every tick: the cost of a tick
follows what changed, not how many attempts are live. A notice is an empty file
``<stage>/changes/<subtask>.<attempt>.<unique>``; unique names mean a notice written while the
controller reads is never deleted unread.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

DIRNAME = "changes"


def notify(stage_dir: str | Path, subtask: int, attempt: int) -> None:
    """Record that attempt ``attempt`` of ``subtask`` changed; best effort (polling is the safety net)."""
    directory = os.path.join(stage_dir, DIRNAME)
    name = os.path.join(directory, f"{subtask}.{attempt}.{uuid.uuid4().hex[:16]}")
    with contextlib.suppress(OSError):
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def pending(stage_dir: str | Path) -> tuple[set[tuple[int, int]], list[str]]:
    """The attempts named by the notices present now, and the notice paths (to :func:`acknowledge`)."""
    directory = os.path.join(stage_dir, DIRNAME)
    keys: set[tuple[int, int]] = set()
    names: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return keys, names
    for entry in entries:
        parts = entry.name.split(".")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            keys.add((int(parts[0]), int(parts[1])))
            names.append(entry.path)
    return keys, names


def any_pending(stage_dir: str | Path) -> bool:
    """True if at least one notice is waiting (reads one directory entry, not the whole listing)."""
    try:
        with os.scandir(os.path.join(stage_dir, DIRNAME)) as entries:
            return next(entries, None) is not None
    except FileNotFoundError:
        return False


def acknowledge(names: list[str]) -> None:
    """Remove notices whose attempts were polled after the notices were listed."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
