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
from airflow_provider_speculative.store.backend import OWNER_FILE, PosixBackend, StoreNotOwnedError
from airflow_provider_speculative.store.files import atomic_write_json, check_store_directory, read_json
from airflow_provider_speculative.store.identity import provider_plan
from airflow_provider_speculative.store.layout import (
    COMMITTED_FILE,
    EXPIRED_FILE,
    JOURNAL_FILE,
    StageLayout,
    safe_component,
    stage_key,
)

LOSER = "loser"
EXPIRED = "expired"
SINK_EXPIRED = "sink-expired"
DELETED_RUN = "deleted-run"
STALE_TEMP = "stale-temp"
STALE_BARRIER = "stale-barrier"
SINK_STAGING = "sink-staging"

# An atomic write lives for milliseconds; a temporary file this old was orphaned by a crash.
STALE_TEMP_AFTER = 3600.0


@dataclass(frozen=True)
class GcItem:
    """One path gc removes (or would remove with ``--dry-run``), the bytes that frees, and why."""

    # A path in the store; for sink staging the sink's own name of the object (a table, a directory).
    path: Path | str
    bytes: int
    reason: str
    detail: str = ""
    # Stage whose journal records the removal; None for a whole run (its journal goes with it).
    stage_dir: Path | None = None
    subtask: int | None = None
    attempt: int | None = None
    # Sink staging only: the sink (as in plan.json) and the stage run whose staging it is.
    sink: dict[str, Any] | None = None
    scope: StagingScope | None = None
    # The store root ``path`` is in: removals are owned deletes of the store there.
    root: Path | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly form (for ``--output json`` and the journal)."""
        return {"path": str(self.path), "bytes": self.bytes, "reason": self.reason, "detail": self.detail,
                "subtask": self.subtask, "attempt": self.attempt}

    def display(self, root: str | Path) -> str:
        """The path relative to the store root; a sink staging object by its own name."""
        return str(self.path) if self.reason == SINK_STAGING else os.path.relpath(self.path, root)


@dataclass
class _Stage:
    """What gc needs to know about one stage run of a DAG run."""

    layout: StageLayout
    plan: dict[str, Any] | None
    committed: dict[str, Any] | None
    attempts: dict[tuple[int, int], Attempt] = field(default_factory=dict)
    admitted: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The stage name (from its plan; the directory name if it has none)."""
        return str((self.plan or {}).get("stage") or self.layout.dir.name)

    @property
    def live(self) -> bool:
        """True if any attempt of the stage may still run or write."""
        return any(a.live for a in self.attempts.values())


def store_dag_ids(root: str | Path) -> dict[str, str]:
    """Map each DAG directory of the store holding a provider run to the DAG id its plans record."""
    out: dict[str, str] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    for dag_dir in _dirs(root):
        # Only directories holding the provider's own runs: a foreign one is no DAG to ask the DB about.
        for run_dir in _dirs(dag_dir):
            plan = provider_plan(run_dir)
            if plan is not None:
                out[dag_dir.name] = str(plan["dag_id"])
                break
    return out


SinkStaging = Callable[[dict[str, Any], StagingScope], list[StagingObject]]


def list_sink_staging(sink: dict[str, Any], scope: StagingScope) -> list[StagingObject]:
    """Ask the sink (as serialised in plan.json) which staging objects it holds for ``scope``."""
    return Sink.from_json(sink).staging(scope)


def plan_gc(root: str | Path, *, now: float, run_states: dict[tuple[str, str], str] | None = None,
            retention: float | None = None, dag_id: str | None = None,
            deleted_runs: Iterable[tuple[str, str]] = (), known_dags: Iterable[str] | None = None,
            deleted_dags: Iterable[str] = (), older_than: float | None = None,
            sink_staging: SinkStaging | None = None, kept: list[str] | None = None) -> list[GcItem]:
    """List what gc would remove under ``root``; nothing is touched.

    ``run_states`` maps (dag_id, run_id) to the Airflow DagRun state, for every DAG planned (restrict
    with ``dag_id``); without it, only attempt leftovers and stale files are considered. A run missing
    from it is removed only if ``deleted_runs`` (or ``deleted_dags``) says it was deleted, or it is
    older than ``older_than`` seconds. With ``known_dags``, a DAG not in it (nor in ``deleted_dags``)
    is left alone. ``retention`` (seconds) overrides each stage's configured ``retention``.
    ``sink_staging`` lists a sink's staging objects (e.g. :func:`list_sink_staging`); None: not looked at.
    Why something that might look removable is kept is appended to ``kept``.
    """
    root = Path(root)
    kept = [] if kept is None else kept
    if not root.is_dir():
        return []
    known = None if run_states is None else {
        (safe_component(d), safe_component(r)): state for (d, r), state in run_states.items()}
    deleted = {(safe_component(d), safe_component(r)) for d, r in deleted_runs}
    gone_dags = {safe_component(d) for d in deleted_dags}
    dags = None if known_dags is None else {safe_component(d) for d in known_dags}
    items: list[GcItem] = []
    for dag_dir in _dirs(root):
        if dag_id is not None and dag_dir.name != safe_component(dag_id):
            continue
        if dag_dir.name == "_targets":
            continue  # slot claims of targets, shared by every run: not a DAG
        runs = _provider_runs(dag_dir, kept)
        if not runs:
            continue
        dag_gone = dag_dir.name in gone_dags
        if dags is not None and dag_dir.name not in dags and not dag_gone and older_than is None:
            kept.append(f"DAG {dag_dir.name}: unknown to this metadata database and its deletion is not recorded "
                        "there; nothing of it is removed (--older-than removes its old runs)")
            continue
        for run_dir in runs:
            if not _owned_run(root, dag_dir.name, run_dir, kept):
                continue
            stages = _read_stages(root, dag_dir.name, run_dir, now)
            if known is not None and (dag_dir.name, run_dir.name) not in known:
                why = _deleted_because(dag_dir.name, run_dir, deleted, dag_gone, older_than, now)
                if why is not None and not any(s.live for s in stages.values()):
                    items += _staging_items(stages, sink_staging, kept, f"the DAG run was deleted ({why})")
                    items.append(GcItem(run_dir, _tree_bytes(run_dir), DELETED_RUN, why, root=root))
                    continue
                # Kept whole; what is garbage whatever the run's state (losers, stale files) still goes.
                kept.append(f"run {dag_dir.name}/{run_dir.name}: " + (
                    "not in the metadata database, but its deletion is not recorded there; kept "
                    "(--older-than removes old runs)" if why is None else "deleted, but an attempt is still live"))
            state = None if known is None else known.get((dag_dir.name, run_dir.name))
            succeeded = state == "success"
            for stage in stages.values():
                items += _loser_items(stage)
                if succeeded:
                    items += _expired_items(stage, stages, now, retention)
                items += _stale_items(stage, now)
                if not stage.live and (state in FINISHED_RUN_STATES or stage.committed is not None):
                    items += _staging_items({stage.name: stage}, sink_staging, kept,
                                            "stage run over: " + ("committed" if stage.committed is not None
                                                                  else f"DAG run {state}"))
            items += _stale_temp(root, run_dir, now, stage_dir=None, recursive=False)
    return items


def _owned_run(root: Path, dag_dir: str, run_dir: Path, kept: list[str]) -> bool:
    """True if this store's ownership marker covers ``run_dir``; else report the run in ``kept``.

    gc never claims a run: a run an older version wrote (no marker) is claimed when a stage of it is
    planned or rerun, where the provider proves it is the run's writer; until then nothing of it goes.
    """
    store = PosixBackend(root)
    try:
        if store.owns(store.name_of(run_dir)):
            return True
    except StoreError as exc:
        kept.append(f"run {dag_dir}/{run_dir.name}: skipped, its ownership cannot be read: {exc}")
        return False
    kept.append(f"run {dag_dir}/{run_dir.name}: skipped, no {OWNER_FILE} of this store ({store.owner}) covers it "
                "(written by an older version or another store); gc never removes what it cannot prove it wrote")
    return False


def _provider_runs(dag_dir: Path, kept: list[str]) -> list[Path]:
    """The run directories of ``dag_dir`` that hold the provider's own plan for exactly that run.

    Anything else under the store root (a user's directory, a file, a run directory without a plan
    naming it) is never looked into, let alone removed: it is reported in ``kept`` instead.
    """
    runs, skipped = [], []
    for entry in sorted(dag_dir.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and provider_plan(entry) is not None:
            runs.append(entry)
        else:
            skipped.append(entry.name + ("/" if entry.is_dir() else ""))
    if skipped:
        shown = ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        kept.append(f"skipped {dag_dir.name}/: {len(skipped)} entries hold no plan.json of this provider naming "
                    f"them ({shown}); gc never removes what it did not write")
    return runs


def _deleted_because(dag_dir: str, run_dir: Path, deleted: set[tuple[str, str]], dag_gone: bool,
                     older_than: float | None, now: float) -> str | None:
    """The evidence that a run missing from the DB was deleted; None if there is none."""
    if (dag_dir, run_dir.name) in deleted:
        return "the audit log records the deletion of the DAG run"
    if dag_gone:
        return "the audit log records the deletion of the DAG"
    if older_than is not None:
        newest = _newest_mtime(run_dir)
        if now - newest >= older_than:
            return f"not in the metadata DB and untouched for {now - newest:.0f}s (--older-than {older_than:g}s)"
    return None


def _newest_mtime(directory: Path) -> float:
    newest = 0.0
    for current, _subdirs, files in os.walk(directory):
        for name in [*files, "."]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(current, name)).st_mtime)
    return newest


def _staging_items(stages: dict[str, _Stage], sink_staging: SinkStaging | None, kept: list[str],
                   detail: str) -> list[GcItem]:
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
            kept.append(f"stage {stage.layout.dir}: sink staging not checked: {type(exc).__name__}: {exc}")
            continue
        items += [GcItem(obj.name, obj.bytes, SINK_STAGING, detail, stage.layout.dir, sink=sink, scope=scope)
                  for obj in objects]
    return items


def execute_gc(items: Iterable[GcItem], *, now: float | None = None, root: str | Path | None = None) -> dict[str, Any]:
    """Remove the planned items; mark expired stages and journal every removal in its stage.

    An expired stage is marked (``expired.json``) before its data goes, so a crash half-way leaves
    the stage reported as expired rather than silently incomplete. Manifests are removed before
    their data for the same reason: a manifest never describes data that is gone. With ``root``, an
    item whose directory is reached through a symlink below it is refused (an error in the summary):
    a stage application can link its ``subtask=`` directory to data that is not the provider's.
    """
    now = time.time() if now is None else now
    items = list(items)
    summary: dict[str, Any] = {"removed": 0, "bytes": 0, "by_reason": {}, "errors": []}
    by_stage: dict[Path, list[GcItem]] = {}
    for item in items:
        if item.stage_dir is not None:
            by_stage.setdefault(item.stage_dir, []).append(item)
    unmarked: set[Path] = set()
    for stage_dir, stage_items in by_stage.items():
        expired = [i for i in stage_items if i.reason in (EXPIRED, SINK_EXPIRED)]
        if expired:
            try:
                _mark_expired(stage_dir, expired, now)
            except StoreError as exc:
                # Without the marker a later reader could not tell why the data is gone: keep it.
                unmarked.add(stage_dir)
                summary["errors"].append({"path": str(stage_dir / EXPIRED_FILE), "error": str(exc)})
    done: dict[Path, list[GcItem]] = {}
    # Sink staging goes first (a deleted run's plan, which names the sink, goes with the run) and
    # only through the sink, which drops exactly its own objects of that stage run.
    items.sort(key=lambda i: i.reason != SINK_STAGING)
    staged = _remove_sink_staging([i for i in items if i.reason == SINK_STAGING], summary)
    for item in items:
        if item.stage_dir in unmarked and item.reason in (EXPIRED, SINK_EXPIRED):
            continue
        try:
            if item.reason == SINK_STAGING:
                if str(item.path) not in staged:
                    continue
            else:
                store_root = root if root is not None else item.root
                if store_root is None:
                    summary["errors"].append({"path": str(item.path), "error": "refused: no store root to prove "
                                                                               "ownership in (not removed)"})
                    continue
                check_store_directory(store_root, Path(item.path).parent)
                _remove(PosixBackend(store_root), Path(item.path))
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
        if item.stage_dir is not None:
            done.setdefault(item.stage_dir, []).append(item)
        elif item.reason == DELETED_RUN:
            # The DAG's directory goes too once its last run is gone.
            with contextlib.suppress(OSError):
                Path(item.path).parent.rmdir()
    for stage_dir, removed in done.items():
        if not stage_dir.is_dir():
            continue
        try:
            journal.record(stage_dir / JOURNAL_FILE, Event.GC, at=now, bytes=sum(i.bytes for i in removed),
                           removed=[{**i.to_json(), "path": i.display(stage_dir)} for i in removed])
        except StoreError as exc:
            summary["errors"].append({"path": str(stage_dir / JOURNAL_FILE), "error": str(exc)})
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
    marker = read_json(layout.expired)
    committed = read_json(layout.committed)
    if marker is None or committed is None or marker.get("committed_at") != committed.get("committed_at"):
        return None
    parts = committed.get("subtasks") or {}
    attempts = {s: a for s, a in (marker.get("attempts") or {}).items()
                if (parts.get(s) or {}).get("attempt") == a}
    return {**marker, "attempts": attempts} if attempts else None


# -- planning -------------------------------------------------------------------------------------


def _dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink())


def _read_stages(root: Path, dag_dir_name: str, run_dir: Path, now: float) -> dict[str, _Stage]:
    stages: dict[str, _Stage] = {}
    for stage_dir in _dirs(run_dir):
        # Directory names are already path-safe, so a layout built from them points back at them.
        layout = StageLayout(root, dag_dir_name, run_dir.name, stage_dir.name)
        try:
            plan = read_json(layout.plan)
            committed = read_json(layout.committed)
        except StoreError:
            plan, committed = None, None  # unreadable: still checked for live attempts, never expired
        stage = _Stage(layout=layout, plan=plan, committed=committed)
        backend = attempt_observer(layout)
        for subtask_dir in sorted(stage_dir.glob("subtask=*")):
            try:
                subtask = int(subtask_dir.name.split("=", 1)[1])
            except ValueError:
                continue
            with contextlib.suppress(StoreError):
                marker = read_json(layout.admitted(subtask))
                if marker is not None:
                    stage.admitted[subtask] = int(marker["attempt"])
            for number in layout.attempt_numbers(subtask):
                if not (layout.claim(subtask, number).exists() or layout.status(subtask, number).exists()):
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


def _attempt_items(stage: _Stage, subtask: int, number: int, reason: str, detail: str) -> list[GcItem]:
    layout = stage.layout
    out = []
    # Manifest first: it marks the data complete, so it must never outlive the data.
    for path in (layout.manifest(subtask, number), layout.data(subtask, number)):
        if path.exists() or path.is_symlink():
            out.append(GcItem(path, _tree_bytes(path), reason, detail, layout.dir, subtask, number,
                              root=layout.root))
    return out


def _loser_items(stage: _Stage) -> list[GcItem]:
    items = []
    committed_at = _committed_at(stage)
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
        items += _attempt_items(stage, subtask, number, LOSER, detail)
    return items


def _committed_at(stage: _Stage) -> float | None:
    if stage.committed is None:
        return None
    at = stage.committed.get("committed_at")
    if at is None:
        with contextlib.suppress(OSError):
            at = stage.layout.committed.stat().st_mtime
    return float(at) if at is not None else None


def _retention(stage: _Stage, override: float | None) -> float:
    if override is not None:
        return override
    try:
        return SpeculativeConfig.from_json((stage.plan or {}).get("config") or {}).retention
    except Exception:  # a plan from another version: fall back to the default rather than guess
        return SpeculativeConfig().retention


def _expired_items(stage: _Stage, stages: dict[str, _Stage], now: float, override: float | None) -> list[GcItem]:
    plan = stage.plan
    own = _committed_at(stage)
    if plan is None or own is None or stage.live:
        return []
    consumers = list(plan.get("consumers") or [])
    retention = _retention(stage, override)
    if consumers:
        ends = []
        for name in consumers:
            consumer = stages.get(name)
            at = _committed_at(consumer) if consumer is not None else None
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
        items += _attempt_items(stage, subtask, number, reason, detail)
    return items


def _stale_items(stage: _Stage, now: float) -> list[GcItem]:
    items = _stale_temp(stage.layout.root, stage.layout.dir, now, stage_dir=stage.layout.dir, recursive=True)
    if not stage.live:
        # An attempt waiting at the barrier would hang without its release file.
        for path in sorted(stage.layout.dir.glob("barrier.release*")):
            items.append(GcItem(path, _tree_bytes(path), STALE_BARRIER, "fault-injection barrier of a finished stage",
                                stage.layout.dir, root=stage.layout.root))
    return items


def _stale_temp(root: Path, directory: Path, now: float, *, stage_dir: Path | None,
                recursive: bool) -> list[GcItem]:
    items = []
    for current, dirs, files in os.walk(directory):
        # Attempt data belongs to Spark and is handled whole; do not look inside.
        dirs[:] = [d for d in dirs if recursive and d != "data"]
        for name in files:
            if not (name.startswith(".") and name.endswith(".tmp")):
                continue
            path = Path(current) / name
            with contextlib.suppress(OSError):
                stat = path.lstat()
                if now - stat.st_mtime > STALE_TEMP_AFTER:
                    items.append(GcItem(path, stat.st_size, STALE_TEMP, "temporary file of an interrupted write",
                                        stage_dir, root=root))
    return items


def _tree_bytes(path: Path) -> int:
    """Bytes removing ``path`` frees: a hard-linked file counts only if every link is inside it."""
    try:
        if not path.is_dir() or path.is_symlink():
            stat = path.lstat()
            return stat.st_size if stat.st_nlink <= 1 else 0
    except OSError:
        return 0
    seen: dict[int, int] = {}
    sizes: dict[int, tuple[int, int]] = {}
    for current, _subdirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                stat = os.lstat(os.path.join(current, name))
                seen[stat.st_ino] = seen.get(stat.st_ino, 0) + 1
                sizes[stat.st_ino] = (stat.st_size, stat.st_nlink)
    # Sink output hard-linked from an attempt's data stays on disk after gc: it frees nothing.
    return sum(size for ino, (size, links) in sizes.items() if seen[ino] >= links)


# -- execution ------------------------------------------------------------------------------------


def _mark_expired(stage_dir: Path, items: list[GcItem], now: float) -> None:
    committed = read_json(stage_dir / COMMITTED_FILE) or {}
    marker_path = stage_dir / EXPIRED_FILE
    previous = read_json(marker_path) or {}
    attempts = dict(previous.get("attempts") or {}) if previous.get("committed_at") == committed.get(
        "committed_at") else {}
    attempts.update({str(i.subtask): i.attempt for i in items})
    atomic_write_json(marker_path, {
        "at": now, "reason": items[0].reason, "detail": items[0].detail,
        "committed_at": committed.get("committed_at"), "fingerprint": committed.get("fingerprint"),
        "attempts": dict(sorted(attempts.items(), key=lambda kv: int(kv[0])))})


def _remove(store: PosixBackend, path: Path) -> None:
    """Remove ``path`` by the store's owned deletes: a directory with all below it, else the object.

    What is gone already is fine: the controller or finalize may remove a loser's output at the same moment.
    """
    name = store.name_of(path)
    if path.is_dir() and not path.is_symlink():
        store.delete_prefix(name)
    else:
        store.delete(name)
