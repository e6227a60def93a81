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
- ``deleted-run``: the whole directory of a run the Airflow DB no longer has, if nothing in it is live.
- ``stale-temp`` / ``stale-barrier``: temporary files of atomic writes orphaned by a crash, and
  fault-injection barrier releases of stages with nothing live.

Sink staging and backup siblings (``.<name>.staging-*``, ``.<name>.old-*``) live next to the sink
output, outside the store, and are not gc's business.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import attempt_observer
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.files import atomic_write_json, read_json
from airflow_provider_speculative.store.layout import StageLayout, safe_component

LOSER = "loser"
EXPIRED = "expired"
SINK_EXPIRED = "sink-expired"
DELETED_RUN = "deleted-run"
STALE_TEMP = "stale-temp"
STALE_BARRIER = "stale-barrier"

EXPIRED_MARKER = "expired.json"
# An atomic write lives for milliseconds; a temporary file this old was orphaned by a crash.
STALE_TEMP_AFTER = 3600.0


@dataclass(frozen=True)
class GcItem:
    """One path gc removes (or would remove with ``--dry-run``), the bytes that frees, and why."""

    path: Path
    bytes: int
    reason: str
    detail: str = ""
    # Stage whose journal records the removal; None for a whole run (its journal goes with it).
    stage_dir: Path | None = None
    subtask: int | None = None
    attempt: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly form (for ``--output json`` and the journal)."""
        return {"path": str(self.path), "bytes": self.bytes, "reason": self.reason, "detail": self.detail,
                "subtask": self.subtask, "attempt": self.attempt}


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
    """Map each DAG directory name in the store to the DAG id its plans record (the name if none does)."""
    out: dict[str, str] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    for dag_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        out[dag_dir.name] = dag_dir.name
        for plan_path in dag_dir.glob("*/*/plan.json"):
            with contextlib.suppress(StoreError):
                plan = read_json(plan_path)
                if plan and plan.get("dag_id"):
                    out[dag_dir.name] = str(plan["dag_id"])
                    break
    return out


def plan_gc(root: str | Path, *, now: float, run_states: dict[tuple[str, str], str] | None = None,
            retention: float | None = None, dag_id: str | None = None) -> list[GcItem]:
    """List what gc would remove under ``root``; nothing is touched.

    ``run_states`` maps (dag_id, run_id) to the Airflow DagRun state. It must cover every DAG planned
    (restrict with ``dag_id``): a run missing from it counts as deleted. Without it, only attempt
    leftovers and stale files are considered. ``retention`` (seconds) overrides each stage's
    configured ``retention`` (from its plan).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    known = None if run_states is None else {
        (safe_component(d), safe_component(r)): state for (d, r), state in run_states.items()}
    items: list[GcItem] = []
    for dag_dir in _dirs(root):
        if dag_id is not None and dag_dir.name != safe_component(dag_id):
            continue
        for run_dir in _dirs(dag_dir):
            stages = _read_stages(root, dag_dir.name, run_dir, now)
            if known is not None and (dag_dir.name, run_dir.name) not in known:
                # The run was deleted from Airflow; a live attempt still writes here, so wait for it.
                if not any(s.live for s in stages.values()):
                    items.append(GcItem(run_dir, _tree_bytes(run_dir), DELETED_RUN,
                                        "the DAG run no longer exists in the Airflow metadata DB"))
                continue
            succeeded = known is not None and known[(dag_dir.name, run_dir.name)] == "success"
            for stage in stages.values():
                items += _loser_items(stage)
                if succeeded:
                    items += _expired_items(stage, stages, now, retention)
                items += _stale_items(stage, now)
            items += _stale_temp(run_dir, now, stage_dir=None, recursive=False)
    return items


def execute_gc(items: Iterable[GcItem], *, now: float | None = None) -> dict[str, Any]:
    """Remove the planned items; mark expired stages and journal every removal in its stage.

    An expired stage is marked (``expired.json``) before its data goes, so a crash half-way leaves
    the stage reported as expired rather than silently incomplete. Manifests are removed before
    their data for the same reason: a manifest never describes data that is gone.
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
                summary["errors"].append({"path": str(stage_dir / EXPIRED_MARKER), "error": str(exc)})
    done: dict[Path, list[GcItem]] = {}
    for item in items:
        if item.stage_dir in unmarked and item.reason in (EXPIRED, SINK_EXPIRED):
            continue
        try:
            _remove(item.path)
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
                item.path.parent.rmdir()
    for stage_dir, removed in done.items():
        if not stage_dir.is_dir():
            continue
        try:
            journal.record(stage_dir / "journal.jsonl", "gc", at=now, bytes=sum(i.bytes for i in removed),
                           removed=[{**i.to_json(), "path": os.path.relpath(i.path, stage_dir)} for i in removed])
        except StoreError as exc:
            summary["errors"].append({"path": str(stage_dir / "journal.jsonl"), "error": str(exc)})
    return summary


def read_expired(layout: StageLayout) -> dict[str, Any] | None:
    """The stage's expiry marker, limited to committed subtasks whose data gc removed; None if none are.

    A stage rerun commits anew and a partition recovery re-commits a subtask with a new attempt:
    what they committed is present again, so the marker no longer covers it.
    """
    marker = read_json(layout.dir / EXPIRED_MARKER)
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
            out.append(GcItem(path, _tree_bytes(path), reason, detail, layout.dir, subtask, number))
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
    items = _stale_temp(stage.layout.dir, now, stage_dir=stage.layout.dir, recursive=True)
    if not stage.live:
        # An attempt waiting at the barrier would hang without its release file.
        for path in sorted(stage.layout.dir.glob("barrier.release*")):
            items.append(GcItem(path, _tree_bytes(path), STALE_BARRIER, "fault-injection barrier of a finished stage",
                                stage.layout.dir))
    return items


def _stale_temp(directory: Path, now: float, *, stage_dir: Path | None, recursive: bool) -> list[GcItem]:
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
                                        stage_dir))
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
    committed = read_json(stage_dir / "committed.json") or {}
    marker_path = stage_dir / EXPIRED_MARKER
    previous = read_json(marker_path) or {}
    attempts = dict(previous.get("attempts") or {}) if previous.get("committed_at") == committed.get(
        "committed_at") else {}
    attempts.update({str(i.subtask): i.attempt for i in items})
    atomic_write_json(marker_path, {
        "at": now, "reason": items[0].reason, "detail": items[0].detail,
        "committed_at": committed.get("committed_at"), "fingerprint": committed.get("fingerprint"),
        "attempts": dict(sorted(attempts.items(), key=lambda kv: int(kv[0])))})


def _ignore_missing(_func: Any, _path: str, exc_info: Any) -> None:
    # The controller or finalize may remove a loser's output at the same moment: gone is gone.
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=_ignore_missing)
    else:
        path.unlink(missing_ok=True)
