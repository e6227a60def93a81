"""Partition life cycle: plan and carry out the removal of what the store no longer needs (FLIP-1).

No Airflow import: the caller (``airflow speculative gc``) reads run states from the metadata DB and
passes them in. Lives in ``control`` rather than ``store`` because it must ask
a backend's poll whether an attempt is still alive, and ``store`` may not import backends.

What goes, and when:

- ``loser``: data and manifest of an attempt that is not its subtask's admitted attempt and is
  terminal (FAILED, CANCELED, or FINISHED after another attempt was admitted). Claim, status and
  log stay so the history remains inspectable.
- ``expired``: the admitted data of an intermediate stage once the DAG run succeeded, every consumer
  stage committed and the newest consumer commit is older than the retention.
- ``sink-expired``: the admitted data of a final stage with a sink (the sink holds its own copy)
  once the run succeeded and its own commit is older than the retention.
- ``deleted-run``: the whole directory of a run the Airflow DB positively says was deleted (its
  audit log records the run's or its DAG's deletion), or, with an explicit ``older_than``, a run the
  DB does not have whose newest file is older than that; never while anything in it is live. A run
  merely missing from the DB is kept and reported: a fresh or foreign database has no runs at all.
  A DAG the DB does not know (and whose deletion it did not record) is left alone entirely.
- ``stale-temp`` / ``stale-barrier``: temporary files of atomic writes orphaned by a crash, and
  fault-injection barrier releases of stages with nothing live.
- ``stale-warm-up``: the prefix of a Connect pool's warm-up on this store (``_warm-up/<id>``, claimed by it)
  an hour after its claim: a warm-up deletes its own at its end, so one still there was killed first.
- ``sink-staging``: what a sink staged outside the store (Postgres staging tables, Parquet
  ``.<name>.staging-*`` / ``.old-*`` directories) for a stage run that is over (committed, or its DAG
  run finished or deleted) with nothing live; removed by the sink itself (``Sink.cleanup_staging``).

Only runs whose prefix carries this store's ownership marker (``<dag>/<run>/_owner.json``, claimed by
planning) are looked into, and every removal is an owned delete: a run without it is reported as
skipped, whatever it holds. Which metadata database the store belongs to is the caller's check
(``store/identity.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.states import FINISHED_RUN_STATES, Attempt, AttemptState
from airflow_provider_speculative.exceptions import StoreError, UnsafeStorePathError
from airflow_provider_speculative.sinks.base import Sink, StagingObject, StagingScope
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.backend import (
    OWNER_FILE,
    ObjectInfo,
    PosixBackend,
    StoreBackend,
    StoreNotOwnedError,
)
from airflow_provider_speculative.store.identity import provider_plan
from airflow_provider_speculative.store.layout import (
    COMMITTED_FILE,
    DATA_DIR,
    EXPIRED_FILE,
    JOURNAL_FILE,
    PLAN_FILE,
    WARM_UP_DIR,
    StageLayout,
    safe_component,
    stage_key,
    store_at,
)
from airflow_provider_speculative.store.slots import TARGETS_DIR

LOSER = "loser"
EXPIRED = "expired"
SINK_EXPIRED = "sink-expired"
DELETED_RUN = "deleted-run"
STALE_TEMP = "stale-temp"
STALE_BARRIER = "stale-barrier"
SINK_STAGING = "sink-staging"
STALE_WARM_UP = "stale-warm-up"

# An atomic write lives for milliseconds; a temporary file this old was orphaned by a crash.
STALE_TEMP_AFTER = 3600.0
# A pool's warm-up is given up after minutes (devtools/localcluster.py WARM_UP_TIMEOUT) and deletes its prefix at
# its end: a prefix claimed this long ago was left by a warm-up killed first, and no job of it still writes there.
STALE_WARM_UP_AFTER = 3600.0
_WARM_UP_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class GcItem:
    """One object or prefix gc removes (or would remove with ``--dry-run``), the bytes that frees, and why."""

    # Where it is: a path in a POSIX store (the backend's description elsewhere); for sink staging the
    # sink's own name of the object (a table, a directory).
    path: Path | str
    bytes: int
    reason: str
    detail: str = ""
    subtask: int | None = None
    attempt: int | None = None
    # Sink staging only: the sink (as in plan.json) and the stage run whose staging it is.
    sink: dict[str, Any] | None = None
    scope: StagingScope | None = None
    # The store it is in (removals are owned deletes there), its name there, whether it is a prefix
    # (everything below it goes), and the stage whose journal records the removal (None for a whole run
    # or a file of the run: its journal goes with it, or it has none).
    store: StoreBackend | None = field(default=None, compare=False, repr=False)
    name: str | None = None
    tree: bool = False
    stage: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly form (for ``--output json`` and the journal)."""
        return {"path": str(self.path), "bytes": self.bytes, "reason": self.reason, "detail": self.detail,
                "subtask": self.subtask, "attempt": self.attempt}

    def display(self, root: str | Path) -> str:
        """The path relative to the store root; a sink staging object by its own name."""
        return str(self.path) if self.reason == SINK_STAGING else os.path.relpath(self.path, root)

    def relative(self, prefix: str) -> str:
        """Its name relative to ``prefix`` (a stage's, for the stage's journal); sink staging by its own name."""
        if self.reason == SINK_STAGING or self.name is None:
            return str(self.path)
        return self.name[len(prefix) + 1:] if self.name.startswith(prefix + "/") else self.name


@dataclass
class _Stage:
    """What gc needs to know about one stage run of a DAG run."""

    layout: StageLayout
    # The stage's prefix in the store (``<dag>/<run>/<stage>``) and what one listing of it showed.
    prefix: str
    entries: list[str]
    plan: dict[str, Any] | None
    committed: dict[str, Any] | None
    attempts: dict[tuple[int, int], Attempt] = field(default_factory=dict)
    admitted: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The stage name (from its plan; the directory name if it has none)."""
        return str((self.plan or {}).get("stage") or self.prefix.rsplit("/", 1)[-1])

    @property
    def live(self) -> bool:
        """True if any attempt of the stage may still run or write."""
        return any(a.live for a in self.attempts.values())

    def of(self, path: Path) -> str:
        """The store name of one of the stage layout's paths (arithmetic on the root: no I/O)."""
        return self.layout.name(path)


def _backend(root: str | Path | StoreBackend) -> StoreBackend:
    return store_at(root)


def _where(store: StoreBackend, name: str) -> Path | str:
    """What an item shows as its path: the POSIX path, or the backend's description of the name."""
    return store.path(name) if isinstance(store, PosixBackend) else store.describe(name)


def _sub_prefixes(store: StoreBackend, prefix: str) -> list[str]:
    """The names right below ``prefix`` that are prefixes (POSIX: directories, never a symlink), sorted."""
    return sorted(entry[:-1] for entry in store.children(prefix) if entry.endswith("/"))


def store_dag_ids(root: str | Path | StoreBackend) -> dict[str, str]:
    """Map each DAG directory of the store holding a provider run to the DAG id its plans record."""
    out: dict[str, str] = {}
    store = _backend(root)
    for dag in _sub_prefixes(store, ""):
        # Only directories holding the provider's own runs: a foreign one is no DAG to ask the DB about.
        for run in _sub_prefixes(store, dag):
            plan = provider_plan(store, f"{dag}/{run}")
            if plan is not None:
                out[dag] = str(plan["dag_id"])
                break
    return out


SinkStaging = Callable[[dict[str, Any], StagingScope], list[StagingObject]]


def list_sink_staging(sink: dict[str, Any], scope: StagingScope) -> list[StagingObject]:
    """Ask the sink (as serialised in plan.json) which staging objects it holds for ``scope``."""
    return Sink.from_json(sink).staging(scope)


def plan_gc(root: str | Path | StoreBackend, *, now: float, run_states: dict[tuple[str, str], str] | None = None,
            retention: float | None = None, dag_id: str | None = None,
            deleted_runs: Iterable[tuple[str, str]] = (), known_dags: Iterable[str] | None = None,
            deleted_dags: Iterable[str] = (), older_than: float | None = None,
            sink_staging: SinkStaging | None = None, kept: list[str] | None = None) -> list[GcItem]:
    """List what gc would remove in the store at ``root`` (a POSIX directory or a store backend); nothing is touched.

    ``run_states`` maps (dag_id, run_id) to the Airflow DagRun state, for every DAG planned (restrict
    with ``dag_id``); without it, only attempt leftovers and stale files are considered. A run missing
    from it is removed only if ``deleted_runs`` (or ``deleted_dags``) says it was deleted, or it is
    older than ``older_than`` seconds. With ``known_dags``, a DAG not in it (nor in ``deleted_dags``)
    is left alone. ``retention`` (seconds) overrides each stage's configured ``retention``.
    ``sink_staging`` lists a sink's staging objects (e.g. :func:`list_sink_staging`); None: not looked at.
    Why something that might look removable is kept is appended to ``kept``.

    The store is walked by name (``children``, ``stat``, ``read_json`` of the backend): one listing per DAG,
    run, stage, subtask and attempt prefix, and one ``stat`` per object sized, so the cost is linear in the
    number of objects; attempt data is sized from one listing of its prefix.
    """
    store = _backend(root)
    kept = [] if kept is None else kept
    known = None if run_states is None else {
        (safe_component(d), safe_component(r)): state for (d, r), state in run_states.items()}
    deleted = {(safe_component(d), safe_component(r)) for d, r in deleted_runs}
    gone_dags = {safe_component(d) for d in deleted_dags}
    dags = None if known_dags is None else {safe_component(d) for d in known_dags}
    items: list[GcItem] = []
    for dag in _sub_prefixes(store, ""):
        if dag_id is not None and dag != safe_component(dag_id):
            continue
        if dag == TARGETS_DIR:
            continue  # slot claims of targets, shared by every run: not a DAG
        handled: set[str] = set()
        if dag == WARM_UP_DIR and dag_id is None:
            warm_ups, handled = _warm_up_items(store, now, kept)
            items += warm_ups
        runs = _provider_runs(store, dag, kept, handled)
        if not runs:
            continue
        dag_gone = dag in gone_dags
        if dags is not None and dag not in dags and not dag_gone and older_than is None:
            kept.append(f"DAG {dag}: unknown to this metadata database and its deletion is not recorded "
                        "there; nothing of it is removed (--older-than removes its old runs)")
            continue
        for run in runs:
            run_name = run.rsplit("/", 1)[-1]
            if not _owned_run(store, dag, run, kept):
                continue
            stages = _read_stages(store, run, now)
            if known is not None and (dag, run_name) not in known:
                why = _deleted_because(store, dag, run, deleted, dag_gone, older_than, now)
                if why is not None and not any(s.live for s in stages.values()):
                    items += _staging_items(store, stages, sink_staging, kept, f"the DAG run was deleted ({why})")
                    items.append(GcItem(_where(store, run), _freed(store.stat_all(run)), DELETED_RUN, why,
                                        store=store, name=run, tree=True))
                    continue
                # Kept whole; what is garbage whatever the run's state (losers, stale files) still goes.
                kept.append(f"run {dag}/{run_name}: " + (
                    "not in the metadata database, but its deletion is not recorded there; kept "
                    "(--older-than removes old runs)" if why is None else "deleted, but an attempt is still live"))
            state = None if known is None else known.get((dag, run_name))
            succeeded = state == "success"
            for stage in stages.values():
                items += _loser_items(store, stage)
                if succeeded:
                    items += _expired_items(store, stage, stages, now, retention)
                items += _stale_items(store, stage, now)
                if not stage.live and (state in FINISHED_RUN_STATES or stage.committed is not None):
                    items += _staging_items(store, {stage.name: stage}, sink_staging, kept,
                                            "stage run over: " + ("committed" if stage.committed is not None
                                                                  else f"DAG run {state}"))
            items += _stale_temp(store, run, now, stage=None, recursive=False)
    return items


def adopt_runs(root: str | Path | StoreBackend, *, dag_id: str | None = None) -> list[str]:
    """Claim each DAG run without a marker that the provider provably wrote (``gc --claim``); return those claimed.

    The proof is planning's (``identity.own_run``): a stage of the run holds a plan of this provider naming
    exactly that run, which is also what gc requires of every run it looks into. A run another store claimed
    is left alone. Nothing is deleted; the runs adopted are gc's like any planned since.
    """
    store = _backend(root)
    adopted = []
    for dag in _sub_prefixes(store, ""):
        if dag == TARGETS_DIR or (dag_id is not None and dag != safe_component(dag_id)):
            continue
        for run in _provider_runs(store, dag, []):
            # A marker that cannot be read or written: the run stays unclaimed, and plan_gc reports it skipped.
            with contextlib.suppress(StoreError, OSError):
                if store.claimed(run) or store.exists(f"{run}/{OWNER_FILE}"):
                    continue  # ours already, or another store's: never taken over
                store.claim(run)
                adopted.append(run)
    return adopted


def _owned_run(store: StoreBackend, dag: str, run: str, kept: list[str]) -> bool:
    """True if run prefix ``run`` carries this store's own ownership marker; else report the run in ``kept``.

    gc never claims a run: a run an older version wrote (no marker) is claimed when a stage of it is
    planned or rerun, where the provider proves it is the run's writer; until then nothing of it goes.
    The store root's marker does not stand in for the run's: it covers whatever else is under the root too.
    """
    run_name = run.rsplit("/", 1)[-1]
    try:
        if store.claimed(run):
            return True
    except StoreError as exc:
        kept.append(f"run {dag}/{run_name}: skipped, its ownership cannot be read: {exc}")
        return False
    kept.append(f"run {dag}/{run_name}: skipped, no {OWNER_FILE} of this store ({store.owner}) covers it "
                "(written by an older version or another store); gc never removes what it cannot prove it wrote "
                "(gc --claim adopts a run a plan of this provider names)")
    return False


def _warm_up_items(store: StoreBackend, now: float, kept: list[str]) -> tuple[list[GcItem], set[str]]:
    """Stale prefixes of pool warm-ups below ``_warm-up/``, and the entries there that are warm-ups of this store.

    A warm-up's prefix is its own only by the marker it wrote when it claimed it: one without this store's marker,
    or not named as a warm-up names its prefix, or holding a provider plan (a DAG called ``_warm-up``), is left to
    the DAG walk, which keeps whatever it did not write.
    """
    items: list[GcItem] = []
    handled: set[str] = set()
    for name in _sub_prefixes(store, WARM_UP_DIR):
        prefix = f"{WARM_UP_DIR}/{name}"
        if not _WARM_UP_ID.fullmatch(name) or provider_plan(store, prefix) is not None:
            continue
        try:
            at = store.claimed_at(prefix)
        except StoreError as exc:
            kept.append(f"{prefix}: skipped, its ownership cannot be read: {exc}")
            handled.add(f"{name}/")
            continue
        if at is None:
            continue
        handled.add(f"{name}/")
        if now - at < STALE_WARM_UP_AFTER:
            kept.append(f"{prefix}: a pool warm-up's, claimed {max(0.0, now - at):.0f} s ago; it deletes it at its "
                        f"end, and gc once it is {STALE_WARM_UP_AFTER:.0f} s old")
            continue
        items.append(GcItem(_where(store, prefix), _freed(store.stat_all(prefix)), STALE_WARM_UP,
                            "a pool warm-up's prefix, left by a warm-up that was stopped before it deleted it",
                            store=store, name=prefix, tree=True))
    return items, handled


def _provider_runs(store: StoreBackend, dag: str, kept: list[str], handled: set[str] | None = None) -> list[str]:
    """The run prefixes under ``dag`` that hold the provider's own plan for exactly that run.

    Anything else under the store root (a user's directory, a file, a run directory without a plan
    naming it) is never looked into, let alone removed: it is reported in ``kept`` instead, except the
    entries in ``handled``, which the caller has dealt with (pool warm-ups).
    """
    runs, skipped = [], []
    for entry in sorted(store.children(dag), key=lambda e: e.rstrip("/")):
        if handled and entry in handled:
            continue
        if entry.endswith("/") and provider_plan(store, f"{dag}/{entry[:-1]}") is not None:
            runs.append(f"{dag}/{entry[:-1]}")
        else:
            skipped.append(entry)
    if skipped:
        shown = ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        kept.append(f"skipped {dag}/: {len(skipped)} entries hold no plan.json of this provider naming "
                    f"them ({shown}); gc never removes what it did not write")
    return runs


def _deleted_because(store: StoreBackend, dag: str, run: str, deleted: set[tuple[str, str]], dag_gone: bool,
                     older_than: float | None, now: float) -> str | None:
    """The evidence that a run missing from the DB was deleted; None if there is none."""
    if (dag, run.rsplit("/", 1)[-1]) in deleted:
        return "the audit log records the deletion of the DAG run"
    if dag_gone:
        return "the audit log records the deletion of the DAG"
    if older_than is not None:
        # The newest modification of any object of the run (S3: LastModified), from one listing of it.
        newest = max((info.mtime for info in store.stat_all(run)), default=0.0)
        if now - newest >= older_than:
            return f"not in the metadata DB and untouched for {now - newest:.0f}s (--older-than {older_than:g}s)"
    return None


def _staging_items(store: StoreBackend, stages: dict[str, _Stage], sink_staging: SinkStaging | None,
                   kept: list[str], detail: str) -> list[GcItem]:
    if sink_staging is None:
        return []
    items = []
    for stage in stages.values():
        sink = ((stage.plan or {}).get("output") or {}).get("sink")
        if not sink or stage.plan is None:
            continue
        scope = StagingScope(stage.plan["dag_id"], stage.plan["run_id"], stage_key(stage.plan))
        try:
            objects = sink_staging(sink, scope)
        except Exception as exc:  # an unreachable sink must not stop gc of the store
            kept.append(f"stage {store.describe(stage.prefix)}: sink staging not checked: {type(exc).__name__}: {exc}")
            continue
        items += [GcItem(obj.name, obj.bytes, SINK_STAGING, detail, sink=sink, scope=scope, store=store,
                         stage=stage.prefix) for obj in objects]
    return items


def execute_gc(items: Iterable[GcItem], *, now: float | None = None,
               root: str | Path | StoreBackend | None = None) -> dict[str, Any]:
    """Remove the planned items; mark expired stages and journal every removal in its stage.

    An expired stage is marked (``expired.json``) before its data goes, so a crash half-way leaves
    the stage reported as expired rather than silently incomplete. Manifests are removed before
    their data for the same reason: a manifest never describes data that is gone. Every removal is an
    owned delete of the item's store (``root`` when given), in a DAG run whose prefix carries this store's
    own marker; on POSIX an item reached through a symlink below the root is refused (an error in the
    summary): a stage application can link its ``subtask=`` directory to data that is not the provider's.
    """
    now = time.time() if now is None else now
    items = list(items)
    given = None if root is None else _backend(root)
    summary: dict[str, Any] = {"removed": 0, "bytes": 0, "by_reason": {}, "errors": []}
    by_stage: dict[tuple[StoreBackend, str], list[GcItem]] = {}
    for item in items:
        store = given or item.store
        if item.stage is not None and store is not None:
            by_stage.setdefault((store, item.stage), []).append(item)
    unmarked: set[tuple[StoreBackend, str]] = set()
    for (store, stage), stage_items in by_stage.items():
        expired = [i for i in stage_items if i.reason in (EXPIRED, SINK_EXPIRED)]
        if expired:
            try:
                _mark_expired(store, stage, expired, now)
            except StoreError as exc:
                # Without the marker a later reader could not tell why the data is gone: keep it.
                unmarked.add((store, stage))
                summary["errors"].append({"path": store.describe(f"{stage}/{EXPIRED_FILE}"), "error": str(exc)})
    done: dict[tuple[StoreBackend, str], list[GcItem]] = {}
    # Sink staging goes first (a deleted run's plan, which names the sink, goes with the run) and
    # only through the sink, which drops exactly its own objects of that stage run.
    items.sort(key=lambda i: i.reason != SINK_STAGING)
    staged = _remove_sink_staging([i for i in items if i.reason == SINK_STAGING], summary)
    for item in items:
        store = given or item.store
        if store is not None and (store, item.stage) in unmarked and item.reason in (EXPIRED, SINK_EXPIRED):
            continue
        try:
            if item.reason == SINK_STAGING:
                if str(item.path) not in staged:
                    continue
            else:
                if store is None or item.name is None:
                    summary["errors"].append({"path": str(item.path), "error": "refused: no store root to prove "
                                                                               "ownership in (not removed)"})
                    continue
                _remove(store, item)
        except UnsafeStorePathError:
            summary["errors"].append({"path": str(item.path), "error": "refused: reached through a symbolic link "
                                                                       "in the store (not removed)"})
            continue
        except StoreNotOwnedError as exc:
            summary["errors"].append({"path": str(item.path), "error": f"refused (not removed): {exc}"})
            continue
        except StoreError as exc:
            summary["errors"].append({"path": str(item.path), "error": f"{type(exc).__name__}: {exc}"})
            continue
        except OSError as exc:
            summary["errors"].append({"path": str(item.path), "error": f"{type(exc).__name__}: {exc}"})
            continue
        summary["removed"] += 1
        summary["bytes"] += item.bytes
        counts = summary["by_reason"].setdefault(item.reason, {"removed": 0, "bytes": 0})
        counts["removed"] += 1
        counts["bytes"] += item.bytes
        if store is None:
            continue
        if item.stage is not None:
            done.setdefault((store, item.stage), []).append(item)
        elif item.reason == DELETED_RUN and item.name is not None:
            # The DAG's prefix goes too once its last run is gone: a directory on POSIX (removed only if
            # empty), nothing at all where a prefix exists only through its objects (the backend knows which).
            with contextlib.suppress(StoreError, OSError):
                store.prune_empty(item.name.rsplit("/", 1)[0])
    for (store, stage), removed in done.items():
        name = f"{stage}/{JOURNAL_FILE}"
        try:
            if not store.children(stage):
                continue  # the stage is gone (its run was deleted): no journal to record in
            journal.append(store, name, Event.GC, at=now, bytes=sum(i.bytes for i in removed),
                           removed=[{**i.to_json(), "path": i.relative(stage)} for i in removed])
        except (StoreError, OSError) as exc:
            summary["errors"].append({"path": store.describe(name), "error": str(exc)})
    return summary


def _remove_sink_staging(items: list[GcItem], summary: dict[str, Any]) -> set[str]:
    """Ask each stage run's sink to remove its staging; return the names it removed."""
    removed: set[str] = set()
    scopes: dict[tuple[str, str, str], GcItem] = {}
    for item in items:
        assert item.scope is not None and item.sink is not None
        scopes.setdefault((item.scope.dag_id, item.scope.run_id, item.scope.stage), item)
    for item in scopes.values():
        assert item.scope is not None and item.sink is not None
        try:
            removed.update(Sink.from_json(item.sink).cleanup_staging(item.scope))
        except Exception as exc:
            summary["errors"].append({"path": str(item.path), "error": f"{type(exc).__name__}: {exc}"})
    return removed


def read_expired(layout: StageLayout) -> dict[str, Any] | None:
    """The stage's expiry marker, limited to committed subtasks whose data gc removed; None if none are.

    A stage rerun commits anew and a partition recovery re-commits a subtask with a new attempt:
    what they committed is present again, so the marker no longer covers it.
    """
    marker = _document(layout, layout.expired)
    committed = _document(layout, layout.committed)
    if marker is None or committed is None or marker.get("committed_at") != committed.get("committed_at"):
        return None
    parts = committed.get("subtasks") or {}
    attempts = {s: a for s, a in (marker.get("attempts") or {}).items()
                if (parts.get(s) or {}).get("attempt") == a}
    return {**marker, "attempts": attempts} if attempts else None


def _document(layout: StageLayout, path: Path) -> Any:
    """The JSON document at ``path`` read by name on the layout's store (None if missing; corrupt: StoreError).

    By ``read``, one open on POSIX: the read model, which calls :func:`read_expired` for every stage it shows,
    checks the stage's directory for links once itself, so each document need not be reached component by
    component as ``PosixBackend.read_json`` does.
    """
    return layout.store.read_document(layout.name(path))


# -- planning -------------------------------------------------------------------------------------


def _numbered(entry: str, key: str) -> int | None:
    """``n`` of a listing entry ``<key>=<n>``, a sub-prefix or not (a POSIX symlink); else None."""
    name = entry.rstrip("/")
    if not name.startswith(f"{key}="):
        return None
    try:
        return int(name.split("=", 1)[1])
    except ValueError:
        return None


def _read_stages(store: StoreBackend, run: str, now: float) -> dict[str, _Stage]:
    dag, run_name = run.split("/")
    stages: dict[str, _Stage] = {}
    for stage_name in _sub_prefixes(store, run):
        # Names are already path-safe, so a layout built from them points back at them.
        layout = StageLayout.over(store, dag, run_name, stage_name)
        prefix = f"{run}/{stage_name}"
        try:
            plan = store.read_json(f"{prefix}/{PLAN_FILE}")
            committed = store.read_json(f"{prefix}/{COMMITTED_FILE}")
        except (StoreError, OSError):
            plan, committed = None, None  # unreadable: still checked for live attempts, never expired
        stage = _Stage(layout=layout, prefix=prefix, entries=store.children(prefix), plan=plan, committed=committed)
        backend = attempt_observer(layout)
        for entry in stage.entries:
            # Any entry named so, as the path walk took it: a subtask linked elsewhere is still looked into for
            # live attempts (whose output a removal then refuses to reach through the link).
            subtask = _numbered(entry, "subtask")
            if subtask is None:
                continue
            with contextlib.suppress(StoreError, OSError):
                marker = store.read_json(stage.of(layout.admitted(subtask)))
                if marker is not None:
                    stage.admitted[subtask] = int(marker["attempt"])
            numbers = sorted(n for e in store.children(stage.of(layout.subtask_dir(subtask)))
                             if (n := _numbered(e, "attempt")) is not None)
            for number in numbers:
                if not (store.exists(stage.of(layout.claim(subtask, number)))
                        or store.exists(stage.of(layout.status(subtask, number)))):
                    continue  # never claimed nor launched: not an attempt
                try:
                    stage.attempts[(subtask, number)] = backend.poll(subtask, number, now)
                except StoreError:
                    # Unreadable records: assume it may be alive, so nothing of it is removed.
                    stage.attempts[(subtask, number)] = Attempt(subtask, number, "?", AttemptState.CREATED)
        for subtask, part in ((committed or {}).get("subtasks") or {}).items():
            stage.admitted.setdefault(int(subtask), int(part["attempt"]))
        stages[stage.name] = stage
    return stages


def _freed(objects: Iterable[ObjectInfo]) -> int:
    """Bytes removing ``objects`` frees: an object counts once, and only if every name sharing its bytes goes.

    On POSIX several names can share one file (hard links: a sink's output linked from an attempt's data stays
    on disk after gc, freeing nothing), told by the inode in ``identity`` and counted by ``links``. A store
    without links (S3: every key is an object of its own) leaves ``identity`` empty and ``links`` at 1, so each
    name is its own group and this is the sum of the sizes: the same rule, needing names only.
    """
    groups: dict[str, list[ObjectInfo]] = {}
    for info in objects:
        groups.setdefault(info.identity or f"name:{info.name}", []).append(info)
    return sum(group[0].size for group in groups.values() if len(group) >= group[0].links)


def _attempt_items(store: StoreBackend, stage: _Stage, subtask: int, number: int, reason: str,
                   detail: str) -> list[GcItem]:
    layout = stage.layout
    out = []
    # Manifest first: it marks the data complete, so it must never outlive the data.
    manifest = stage.of(layout.manifest(subtask, number))
    info = store.stat(manifest)
    if info is not None:
        out.append(GcItem(_where(store, manifest), _freed([info]), reason, detail, subtask, number, store=store,
                          name=manifest, stage=stage.prefix))
    # The data is a prefix: sized from one listing; present if anything is below it, or (POSIX) as an empty
    # directory.
    data = stage.of(layout.data(subtask, number))
    objects = store.stat_all(data)
    if objects or store.exists(data):
        out.append(GcItem(_where(store, data), _freed(objects), reason, detail, subtask, number, store=store,
                          name=data, tree=True, stage=stage.prefix))
    return out


def _loser_items(store: StoreBackend, stage: _Stage) -> list[GcItem]:
    items = []
    committed_at = _committed_at(store, stage)
    for (subtask, number), attempt in sorted(stage.attempts.items()):
        winner = stage.admitted.get(subtask)
        if winner == number:
            continue
        if attempt.state in (AttemptState.FAILED, AttemptState.CANCELED):
            detail = f"attempt {attempt.state.value}" + (f": {attempt.cause}" if attempt.cause else "")
        elif (attempt.state == AttemptState.FINISHED and winner is not None and committed_at is not None
              and attempt.end_at is not None and attempt.end_at <= committed_at):
            # Finished before the stage committed another attempt: finalize passed it over for good.
            detail = f"attempt FINISHED but attempt {winner} was committed"
        else:
            # Live, or finished without a commit choosing another: the controller (or a partition
            # recovery re-producing a lost result after the commit) may still admit it.
            continue
        items += _attempt_items(store, stage, subtask, number, LOSER, detail)
    return items


def _committed_at(store: StoreBackend, stage: _Stage) -> float | None:
    if stage.committed is None:
        return None
    at = stage.committed.get("committed_at")
    if at is None:
        with contextlib.suppress(StoreError, OSError):
            info = store.stat(f"{stage.prefix}/{COMMITTED_FILE}")
            at = None if info is None else info.mtime
    return float(at) if at is not None else None


def _retention(stage: _Stage, override: float | None) -> float:
    if override is not None:
        return override
    try:
        return SpeculativeConfig.from_json((stage.plan or {}).get("config") or {}).retention
    except Exception:  # a plan from another version: fall back to the default rather than guess
        return SpeculativeConfig().retention


def _expired_items(store: StoreBackend, stage: _Stage, stages: dict[str, _Stage], now: float,
                   override: float | None) -> list[GcItem]:
    plan = stage.plan
    own = _committed_at(store, stage)
    if plan is None or own is None or stage.live:
        return []
    consumers = list(plan.get("consumers") or [])
    retention = _retention(stage, override)
    if consumers:
        ends = []
        for name in consumers:
            consumer = stages.get(name)
            at = _committed_at(store, consumer) if consumer is not None else None
            if consumer is None or at is None or consumer.live:
                return []  # a consumer has not committed, or is reading the result right now
            ends.append(at)
        since, reason = max(ends), EXPIRED
        detail = (f"run succeeded, consumers {', '.join(consumers)} committed, "
                  f"retention {retention:g}s passed")
    elif (plan.get("output") or {}).get("sink"):
        since, reason = own, SINK_EXPIRED
        detail = f"run succeeded, the sink holds the output, retention {retention:g}s passed"
    else:
        return []  # a final stage without a sink: its store copy is the pipeline's only output
    if now - since < retention:
        return []
    items = []
    for subtask, number in sorted(stage.admitted.items()):
        items += _attempt_items(store, stage, subtask, number, reason, detail)
    return items


def _stale_items(store: StoreBackend, stage: _Stage, now: float) -> list[GcItem]:
    items = _stale_temp(store, stage.prefix, now, stage=stage.prefix, recursive=True)
    if not stage.live:
        # An attempt waiting at the barrier would hang without its release file.
        for entry in stage.entries:
            if not entry.startswith("barrier.release"):
                continue
            name, tree = f"{stage.prefix}/{entry.rstrip('/')}", entry.endswith("/")
            if tree:
                size = _freed(store.stat_all(name))
            else:
                info = store.stat(name)
                size = 0 if info is None else _freed([info])
            items.append(GcItem(_where(store, name), size, STALE_BARRIER, "fault-injection barrier of a finished "
                                "stage", store=store, name=name, tree=tree, stage=stage.prefix))
    return items


def _stale_temp(store: StoreBackend, prefix: str, now: float, *, stage: str | None,
                recursive: bool) -> list[GcItem]:
    # Attempt data belongs to Spark and is handled whole: not looked into.
    return [GcItem(_where(store, info.name), info.size, STALE_TEMP, "temporary file of an interrupted write",
                   store=store, name=info.name, stage=stage)
            for info in store.temporaries(prefix, recursive=recursive, skip=(DATA_DIR,))
            if now - info.mtime > STALE_TEMP_AFTER]


# -- execution ------------------------------------------------------------------------------------


def _mark_expired(store: StoreBackend, stage: str, items: list[GcItem], now: float) -> None:
    committed = store.read_json(f"{stage}/{COMMITTED_FILE}") or {}
    marker = f"{stage}/{EXPIRED_FILE}"
    previous = store.read_json(marker) or {}
    attempts = dict(previous.get("attempts") or {}) if previous.get("committed_at") == committed.get(
        "committed_at") else {}
    attempts.update({str(i.subtask): i.attempt for i in items})
    store.replace_json(marker, {
        "at": now, "reason": items[0].reason, "detail": items[0].detail,
        "committed_at": committed.get("committed_at"), "fingerprint": committed.get("fingerprint"),
        "attempts": dict(sorted(attempts.items(), key=lambda kv: int(kv[0])))})


def _remove(store: StoreBackend, item: GcItem) -> None:
    """Remove ``item`` by the store's owned deletes: a prefix with all below it, else the object.

    Only in a DAG run whose prefix carries this store's own marker (checked again here: a list planned
    earlier, by ``--dry-run``, may be carried out after the run lost it); the root's marker does not count.
    What is gone already is fine: the controller or finalize may remove a loser's output at the same moment.
    """
    assert item.name is not None
    parts = item.name.split("/")
    run = "/".join(parts[:2])
    if len(parts) < 2 or not store.claimed(run):
        raise StoreNotOwnedError(f"cannot delete {store.describe(item.name)!r}: the DAG run's prefix "
                                 f"{store.describe(run)!r} has no ownership marker ({OWNER_FILE}) of this store "
                                 f"({store.owner!r})")
    if item.tree:
        store.delete_prefix(item.name)
    else:
        store.delete(item.name)
