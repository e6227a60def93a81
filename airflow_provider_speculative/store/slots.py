"""Slot claims of a target, shared by every stage and DAG run using it: ``<store>/_targets/<target>/slots/``.

A slot is one file ``slot-<k>.json`` created exclusively (a hard link of a complete temporary file,
like ``claim.json``): whoever creates it holds slot ``k``. The holder's record names its attempt
(dag, run, stage, subtask, attempt) and a random token. Releasing is an unlink by the holder's
controller once the attempt is terminal; a slot whose holder is provably gone (``core.slots.holder_gone``)
is reclaimed by renaming it to a unique name first, so two reclaimers never both remove a fresh claim.

Cost: counting held slots lists one directory of about ``capacity`` entries (no file reads); holders
are read only when a stage wants a slot, finds none free and a reclaim is due.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.slots import holder_gone
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout, safe_component

TARGETS_DIR = "_targets"
_SLOT = re.compile(r"^slot-(\d+)\.json$")


class TargetSlots:
    """The slot claims of one target in one store."""

    def __init__(self, root: Path, target: str) -> None:
        self.root = Path(root)
        self.target = target
        self.store = PosixBackend(self.root)
        self.prefix = f"{TARGETS_DIR}/{safe_component(target)}/slots"
        self.dir = self.root / self.prefix

    def path(self, index: int) -> Path:
        """The claim file of slot ``index``."""
        return self.dir / self.name(index)

    @staticmethod
    def name(index: int) -> str:
        """The claim's name within the slots directory."""
        return f"slot-{index}.json"

    def indexes(self) -> list[int]:
        """Indexes of the slots held now (one directory listing, no file read)."""
        return sorted(int(m.group(1)) for e in self.store.children(self.prefix) if (m := _SLOT.match(e)))

    def count(self) -> int:
        """How many slots are held now, by any stage or run."""
        return len(self.indexes())

    def holders(self) -> dict[int, dict[str, Any]]:
        """Slot index -> holder record (reads each claim: used for reclaims and the status view only)."""
        out = {}
        for index in self.indexes():
            record = self.store.read_json(f"{self.prefix}/{self.name(index)}")
            if record is not None:
                out[index] = record
        return out

    def claim(self, capacity: int, holder: dict[str, Any]) -> tuple[int, str] | None:
        """Take the lowest free slot below ``capacity``; return (index, token), or None if all are held."""
        held = set(self.indexes())
        token = uuid.uuid4().hex
        for index in range(capacity):
            if index in held:
                continue
            if self.store.create_exclusive_json(f"{self.prefix}/{self.name(index)}", {**holder, "token": token}):
                return index, token
        return None

    def release(self, index: int, token: str) -> bool:
        """Remove slot ``index`` if it is still ours (its token); True if it was."""
        record = self.store.read_json(f"{self.prefix}/{self.name(index)}")
        if record is None or record.get("token") != token:
            return False  # reclaimed already (we were presumed gone): the file is someone else's now
        return self._remove_if(self.path(index), token)

    def _remove_if(self, path: Path, token: str) -> bool:
        """Rename then check: a claim created after our read is put back, never deleted.

        POSIX only (rename and link): the store backend interface has no conditional delete yet.
        """
        tomb = path.with_name(f".{path.name}.{uuid.uuid4().hex}.released")
        try:
            os.rename(path, tomb)
        except FileNotFoundError:
            return False
        record = read_json(tomb) or {}
        if record.get("token") == token:
            tomb.unlink(missing_ok=True)
            return True
        # Between our read and the rename the slot changed hands: restore the new holder's claim.
        with contextlib.suppress(FileExistsError):
            os.link(tomb, path)
        tomb.unlink(missing_ok=True)
        return False

    def reclaim_gone(self, now: float, skip: Callable[[dict[str, Any]], bool] = lambda holder: False,
                     ) -> list[tuple[int, dict[str, Any], str]]:
        """Free the slots whose holders are provably gone (except ``skip``-ped ones); return (index, holder, why)."""
        freed = []
        for index, holder in self.holders().items():
            if skip(holder):
                continue
            why = _gone(self.root, holder, now)
            if why and self._remove_if(self.path(index), str(holder.get("token"))):
                freed.append((index, holder, why))
        return freed


def holder_record(layout: StageLayout, subtask: int, attempt: int, now: float) -> dict[str, Any]:
    """What a slot claim says about its holder (enough to find its attempt's status)."""
    return {"dag_id": layout.dag_id, "run_id": layout.run_id, "stage": layout.stage, "subtask": subtask,
            "attempt": attempt, "claimed_at": now}


def _gone(root: Path, holder: dict[str, Any], now: float) -> str | None:
    try:
        layout = StageLayout(root, str(holder["dag_id"]), str(holder["run_id"]), str(holder["stage"]))
        subtask, attempt = int(holder["subtask"]), int(holder["attempt"])
    except (KeyError, TypeError, ValueError):
        return "unreadable holder record"
    status = layout.store.read_json(layout.name(layout.status(subtask, attempt)))
    return holder_gone(holder, status, layout.store.exists(layout.name(layout.claim(subtask, attempt))), now)
