"""How slow each target was in earlier stage runs: ``<store>/_targets/<target>/speed.json`` (core/speed.py).

One small file per target, rewritten (atomically) when a stage run that measured two or more targets
completes; the last writer wins. A record older than :data:`MAX_AGE` is ignored, so a node that was
slow last week is not avoided forever; a target that history from an earlier DAG run calls slow still
gets one original in one stage of the next DAG run (a probe, see ``core/scheduler.py``; claimed in
``probes/`` so that concurrent stages of a run do not each send one), so a node that was fixed is
measured again. A record written by an earlier stage of the same DAG run needs no probe.

Every function takes the store as its backend (a stage's ``layout.store``) or, for callers with a POSIX root,
its directory: records and claims are read and written by name, never by a path of the root.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store.backend import StoreBackend, StoreNotOwnedError
from airflow_provider_speculative.store.layout import safe_component, store_at
from airflow_provider_speculative.store.slots import TARGETS_DIR

MAX_AGE = 7 * 86400.0
# The last part of a record's ``from`` when a speed check wrote it (``<dag_id>/<run_id>/speed-check``).
SPEED_CHECK = "speed-check"
# What claim_probe names its files: pruning removes only these, never anything else in the directory.
_PROBE_NAME = re.compile(r"^[0-9a-f]{24}\.json$")


def speed_name(target: str) -> str:
    """The store name of ``target``'s speed record."""
    return f"{TARGETS_DIR}/{safe_component(target)}/speed.json"


def speed_path(root: Path, target: str) -> Path:
    """The speed record of ``target`` in the POSIX store at ``root``."""
    return Path(root) / speed_name(target)


# A store: its backend, or (callers with a POSIX root) its directory.
Store = Path | StoreBackend


@dataclass(frozen=True)
class SpeedRecord:
    """One target's valid speed record: its slowness, when and by what it was written."""

    slowness: float
    at: float
    # ``<dag_id>/<run_id>/<stage>`` for a stage run's measurement, ``<dag_id>/<run_id>/speed-check`` for a check.
    source: str

    def of_run(self, run: str) -> bool:
        """Written in DAG run ``run`` (``"<dag_id>/<run_id>"``), by a stage or its speed check."""
        return self.source.startswith(f"{run}/")

    def checked_in(self, run: str) -> bool:
        """Written by DAG run ``run``'s speed check."""
        return self.source == f"{run}/{SPEED_CHECK}"


def read_records(root: Store, targets: Iterable[str], now: float) -> dict[str, SpeedRecord]:
    """Each target's record if readable, valid and not older than :data:`MAX_AGE` (the others are left out)."""
    out: dict[str, SpeedRecord] = {}
    store = store_at(root)
    for target in targets:
        try:
            record = store.read_json(speed_name(target))
        except (StoreError, OSError, ValueError):
            continue  # a damaged record only costs the first wave its hint
        if not isinstance(record, dict):
            continue
        factor, at = record.get("slowness"), record.get("at")
        if isinstance(factor, int | float) and isinstance(at, int | float) and 0 <= now - at <= MAX_AGE and factor > 0:
            out[target] = SpeedRecord(float(factor), float(at), str(record.get("from") or ""))
    return out


def read_history(root: Store, targets: Iterable[str], now: float,
                 run: str | None = None) -> tuple[dict[str, float], frozenset[str]]:
    """Slowness of each target from its valid record, and the targets whose record DAG run ``run`` wrote.

    Those were measured in this DAG run, so they need no probe (core/scheduler.py).
    """
    records = read_records(root, targets, now)
    return ({t: r.slowness for t, r in records.items()},
            frozenset(t for t, r in records.items() if run is not None and r.of_run(run)))


def record_speeds(root: Store, slowness: Mapping[str, float], now: float, where: str) -> None:
    """Keep what a completed stage run measured; a store that cannot take it must not fail the stage."""
    store = store_at(root)
    for target, factor in slowness.items():
        with contextlib.suppress(StoreError, OSError):
            store.replace_json(speed_name(target), {"slowness": round(factor, 3), "at": now, "from": where})


def _check_claim(targets: Iterable[str], run: str) -> tuple[str, str] | None:
    """(the target whose probes directory holds it, the claim's key) of a DAG run's speed check."""
    names = sorted(targets)
    return (names[0], f"{run}#{SPEED_CHECK}:{','.join(names)}") if names else None


def claim_speed_check(root: Store, targets: Iterable[str], run: str, now: float) -> bool:
    """Claim DAG run ``run``'s speed check of ``targets``; False if a concurrent stage of the run has it.

    Kept with the first target's probe claims (same file names, same pruning).
    """
    claim = _check_claim(targets, run)
    return claim is not None and claim_probe(root, claim[0], claim[1], now)


def speed_check_claimed_at(root: Store, targets: Iterable[str], run: str) -> float | None:
    """When DAG run ``run``'s speed check of ``targets`` was claimed; None if not (or unreadable)."""
    claim = _check_claim(targets, run)
    if claim is None:
        return None
    with contextlib.suppress(StoreError, OSError, ValueError):
        record = store_at(root).read_json(_probe_name(claim[0], claim[1]))
        if isinstance(record, dict) and isinstance(record.get("at"), int | float):
            return float(record["at"])
    return None


def _probe_name(target: str, run: str) -> str:
    return f"{TARGETS_DIR}/{safe_component(target)}/probes/{hashlib.sha256(run.encode()).hexdigest()[:24]}.json"


def claim_probe(root: Store, target: str, run: str, now: float, store: StoreBackend | None = None) -> bool:
    """Claim the one probe of ``target`` for DAG run ``run`` (``"<dag_id>/<run_id>"``); False if taken.

    Exclusive create, so of several stages of a run starting at once exactly one probes; claims older
    than :data:`MAX_AGE` are pruned on the way (at most one file per DAG run and slow target).
    ``store``: the store at ``root`` as a backend (default: ``root`` itself, or the POSIX directory ``root``).
    """
    store = store_at(root) if store is None else store
    claim = _probe_name(target, run)
    _prune_probes(store, target, claim, now)
    try:
        return store.create_exclusive_json(claim, {"run": run, "at": now})
    except (StoreError, OSError):
        return False  # a store that cannot take it: no probe, history stays until it expires


def _prune_probes(store: StoreBackend, target: str, keep: str, now: float) -> None:
    """Delete the probe claims of ``target`` older than :data:`MAX_AGE` (by their modification time), but ``keep``.

    One listing of the probes prefix and one stat per claim. Owned deletes: the first time there is something
    to prune, the target's prefix (``_targets/<target>``, all of it the provider's: speed record, probe claims,
    slots) is claimed, its marker kept outside ``probes/``; a prefix another store claimed is left unpruned.
    """
    probes = keep.rsplit("/", 1)[0]
    with contextlib.suppress(StoreError, OSError):
        owned: bool | None = None
        for entry in store.children(probes):
            if not _PROBE_NAME.match(entry) or f"{probes}/{entry}" == keep:
                continue  # a sub-prefix, or not a name claim_probe makes: never ours to delete
            name = f"{probes}/{entry}"
            with contextlib.suppress(StoreError, OSError):
                info = store.stat(name)
                if info is None or now - info.mtime <= MAX_AGE:
                    continue
                if owned is None:
                    owned = _own_target(store, target)
                if not owned:
                    return
                store.delete(name)


def _own_target(store: StoreBackend, target: str) -> bool:
    """Own the target's prefix so that pruning may delete there; False if another store owns it."""
    try:
        store.claim(f"{TARGETS_DIR}/{safe_component(target)}")
    except StoreNotOwnedError:
        return False
    return True
