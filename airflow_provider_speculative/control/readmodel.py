"""Read a DAG run's stages, subtasks and attempts from the store (for the CLI and the UI).

Two ways to decide whether an attempt that has not recorded its end is still alive:

- ``liveness="process"`` (the CLI's default, what the controller does): look the supervisor's pid up
  on this host (and trust ``alive_at`` for a supervisor on another host);
- ``liveness="heartbeat"`` (the UI): only the store's timestamps count, so the answer does not depend on
  where the reader runs. An attempt is alive while the newest of its runtime heartbeat (``heartbeat.json``
  ``at``, every 2 s), its supervisor's refresh (``status.json`` ``alive_at``, every 5 s) and its start is
  younger than :data:`HEARTBEAT_STALE_AFTER` seconds; after that it shows as failed, "presumed lost".
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import Backend
from airflow_provider_speculative.backends.registry import attempt_observer, heartbeat_observer
from airflow_provider_speculative.control.lifecycle import read_expired
from airflow_provider_speculative.core.breakdown import (
    attempt_phases,
    breakdown_line,
    critical_path,
    critical_path_line,
    stage_breakdown,
)
from airflow_provider_speculative.core.events import Event, is_routine
from airflow_provider_speculative.core.graph import producers_first
from airflow_provider_speculative.core.parallelism import describe_decision, skew_message
from airflow_provider_speculative.core.speed import SLOW_FACTOR
from airflow_provider_speculative.core.states import (  # noqa: F401  (the liveness rule, re-exported for the CLI)
    HEARTBEAT_STALE_AFTER,
    LIVE,
    TERMINAL,
    Attempt,
    current_attempt,
    heartbeat_alive,
    last_sign_of_life,
)
from airflow_provider_speculative.core.summary import StageSummary
from airflow_provider_speculative.exceptions import NotFoundError, PipelineError, StoreError
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import (
    ADMITTED_FILE,
    CLAIM_FILE,
    HEARTBEAT_FILE,
    MANIFEST_FILE,
    PLAN_FILE,
    STATUS_FILE,
    StageLayout,
    safe_component,
    stage_key,
)

LIVENESS_MODES = ("process", "heartbeat")


def observer(layout: StageLayout, liveness: str = "process") -> Backend:
    """The attempt reader for a liveness mode (see the module docstring)."""
    if liveness == "heartbeat":
        return heartbeat_observer(layout)
    if liveness != "process":
        raise ValueError(f"unknown liveness mode {liveness!r}; expected one of {', '.join(LIVENESS_MODES)}")
    return attempt_observer(layout)


def read_plan(path: Path) -> dict[str, Any]:
    """A stage's plan.json; :class:`StoreError` naming the file if it is corrupt or not a stage plan."""
    plan = read_json(path)
    if not isinstance(plan, dict) or not all(k in plan for k in ("stage", "parallelism", "store_root")):
        raise StoreError(f"{path} is not a stage plan (missing stage, parallelism or store_root); "
                         "it was damaged or written by something else")
    return plan


def run_plans(root: Path, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    """Every stage planned in the run (store key -> plan.json), empty when none is.

    Keyed by store key (the stage name, or the task id in a pipeline compiled as a TaskGroup): two grouped
    pipelines of one DAG may both have a stage of a name.
    """
    run_dir = Path(root) / safe_component(dag_id) / safe_component(run_id)
    plans = (read_plan(path) for path in sorted(run_dir.glob("*/plan.json")))
    return {stage_key(plan): plan for plan in plans}


def upstream_keys(plan: Mapping[str, Any]) -> list[str]:
    """The store keys of the stages ``plan``'s stage reads."""
    return [stage_key(plan, str(u)) for u in plan.get("upstreams") or []]


def find_stage_key(plans: Mapping[str, Mapping[str, Any]], stage: str, where: str) -> str:
    """The store key ``stage`` names among a run's plans: a key, or a stage name only one pipeline has.

    NotFoundError naming the candidates when several grouped pipelines have a stage of that name.
    """
    if stage in plans:
        return stage
    named = sorted(key for key, plan in plans.items() if plan.get("stage") == stage)
    if len(named) > 1:
        raise NotFoundError(f"{where}: stage {stage!r} is ambiguous, pipelines compiled as task groups each have "
                            f"one ({', '.join(named)}); name it by its task id")
    return named[0] if named else stage


def pipeline_order(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plans with every stage after its upstreams (then by name): the order a reader follows the pipeline."""
    by_name = {stage_key(p): p for p in plans}
    try:
        order = producers_first(sorted(by_name), lambda s: upstream_keys(by_name[s]), "status")
    except PipelineError:
        order = sorted(by_name)  # a cycle cannot come from a validated graph; a damaged store still lists all
    return [by_name[name] for name in order]


def latest_run_id(root: Path, dag_id: str) -> str:
    """The run of ``dag_id`` whose stages were planned last in the store (its plan.json is the newest)."""
    dag_dir = Path(root) / safe_component(dag_id)
    newest: tuple[float, Path] | None = None
    if dag_dir.is_dir():
        for plan in dag_dir.glob("*/*/plan.json"):
            with contextlib.suppress(OSError):
                mtime = plan.stat().st_mtime
                if newest is None or mtime > newest[0]:
                    newest = (mtime, plan)
    if newest is None:
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} under {root}")
    return str(read_plan(newest[1])["run_id"])


def run_report(root: Path, dag_id: str, run_id: str, stage: str | None = None, *,
               liveness: str = "process", now: float | None = None, with_claims: bool = False) -> dict[str, Any]:
    """Stages (in plan order) -> subtasks -> attempts for one DAG run (``with_claims``: see stage_report)."""
    run_dir = Path(root) / safe_component(dag_id) / safe_component(run_id)
    if not run_dir.is_dir():
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} run {run_id!r} under {root}")
    stages = []
    plans = [read_plan(p / PLAN_FILE) for p in sorted(run_dir.iterdir()) if (p / PLAN_FILE).is_file()]
    if stage:
        stage = find_stage_key({stage_key(p): p for p in plans}, stage, f"dag {dag_id!r} run {run_id!r}")
    for plan in pipeline_order(plans):
        if stage and stage_key(plan) != stage:
            continue
        stages.append(stage_report(StageLayout(Path(plan["store_root"]), dag_id, run_id, stage_key(plan)), plan,
                                   liveness=liveness, now=now, with_claims=with_claims))
    if stage and not stages:
        raise NotFoundError(f"stage {stage!r} not found in dag {dag_id!r} run {run_id!r}")
    order = {s["stage"]: i for i, s in enumerate(stages)}
    for s in stages:
        order[s["stage"]] = max([order.get(u, 0) + 1 for u in s["upstreams"]] + [0])
    stages.sort(key=lambda s: (order[s["stage"]], s["stage"]))
    path = critical_path(stages) if not stage else []
    return {"dag_id": dag_id, "run_id": run_id, "stages": stages, "critical_path": path,
            "critical_path_line": critical_path_line(path)}


def stage_report(layout: StageLayout, plan: Mapping[str, Any], *, liveness: str = "process",
                 now: float | None = None, with_claims: bool = False) -> dict[str, Any]:
    """One stage: summary, committed flag and every subtask's attempts with the current one.

    ``with_claims`` adds each attempt's claim ``reason`` and ``created`` (what the UI shows), read with the
    attempt instead of once more per poll.
    """
    now = time.time() if now is None else now
    backend = observer(layout, liveness)
    summary: StageSummary = read_json(layout.summary) or StageSummary()
    committed = read_json(layout.committed)
    journal = journal_records(layout)
    reused = set(summary.get("reused") or [])
    input_waits = summary.get("input_waits") or {}
    subtasks = []
    admitted_phases = []
    reader = _AttemptReader(layout, backend, liveness, now)
    # One listing of the stage directory: a subtask without a directory has no attempt and no admission, so
    # its paths are not built and probed one by one (32,768 of them took seconds on every poll).
    present = _subtask_dirs(layout)
    for subtask in range(plan["parallelism"]):
        rows, marker = reader.subtask(subtask) if subtask in present else ([], None)
        current = current_attempt([row.attempt for row in rows])
        chosen = marker["attempt"] if marker else None
        for row in rows:
            if row.phases is not None and row.attempt.number == chosen:
                admitted_phases.append(row.phases)
        attempts = []
        for row in rows:
            entry = dict(row.report)
            entry["admitted"] = bool(marker and chosen == row.attempt.number)
            if with_claims:
                entry["reason"], entry["created"] = row.reason, row.created
            attempts.append(entry)
        subtasks.append({
            "subtask": subtask,
            "admitted": chosen,
            "current": current.number if current else None,
            "reused": subtask in reused,
            # Hybrid inputs: what a subtask without an attempt yet waits for (the first few, from the summary).
            "waiting_for": input_waits.get(str(subtask)),
            "attempts": attempts,
        })
    breakdown = stage_breakdown(admitted_phases)
    return {
        # The store key: what the CLI and the UI name a stage by (its task id in a grouped pipeline).
        "stage": stage_key(plan), "name": plan["stage"], "pipeline": plan.get("pipeline"),
        "parallelism": plan["parallelism"], "upstreams": upstream_keys(plan),
        "parallelism_decision": plan.get("parallelism_decision"),
        "parallelism_line": describe_decision(plan.get("parallelism_decision")),
        "plan_warnings": list(plan.get("warnings") or []),
        # Skew the plan split (splittable_skew); skew it could not split is among the warnings.
        "skew_splits": [f"input {e['input']!r}: {skew_message(e)}" for e in plan.get("exchange_skew") or []
                        if e.get("split", 1) > 1],
        "consumers": [stage_key(plan, str(c)) for c in plan.get("consumers") or []],
        "committed": committed is not None,
        # Set once gc removed the committed data (FLIP-1 life cycle): a consumer rerun finds it missing.
        "expired": read_expired(layout),
        "sink": (committed or {}).get("sink"), "speculation": summary.get("speculation"),
        "numSlowExecutionVertices": summary.get("numSlowExecutionVertices", 0),
        "numEffectiveSpeculativeExecutions": summary.get("numEffectiveSpeculativeExecutions", 0),
        "blocked_nodes": summary.get("blocked_nodes", {}), "baseline_seconds": summary.get("baseline_seconds"),
        # FLIP-159: what each target offered at the controller's last check, and why the stage waits.
        "slots": summary.get("slots") or {}, "slot_status": summary.get("slot_status"),
        "slots_observed_at": summary.get("updated_at"),
        "lost_nodes": summary.get("lost_nodes") or {},
        "target_lost_attempts": summary.get("target_lost_attempts", 0),
        "subtasks": subtasks, "journal_events": len(journal),
        "hybrid_inputs": summary.get("hybrid_inputs") or {}, "input_waits": input_wait_lines(summary),
        "speed_line": speed_line(summary),
        "breakdown": breakdown,
        "breakdown_line": breakdown_line(breakdown, len(admitted_phases)),
        "failed": _stage_failed(journal, committed is not None),
    }


# -- the ended-attempt cache ----------------------------------------------------------------------------
#
# The UI polls a stage every 2 s, and a stage of 32,768 subtasks has ~10 small files per attempt: reading
# them all took tens of seconds per poll. An attempt whose status.json records a terminal state and its end
# changes only when a file in its directory is created, replaced (every JSON file is renamed over) or
# removed (invalidated.json, a loser's manifest, gc), and each of those changes the directory's mtime and
# ctime. So its report row is kept per process, keyed by its directory's stat, and a poll costs one stat
# per ended attempt plus one per subtask directory (new attempts, admitted.json created, replaced or
# removed). Rows of attempts that have not ended are never kept: their answer depends on the clock.
# A row is a few KB: two stages of the 32,768-subtask maximum, bounded to a couple of hundred MB of an
# api-server's memory; beyond it the least recently polled rows are read again.
ENDED_CACHE_ENTRIES = 65_536
# A directory changed within this many seconds of being read may change again within the same tick of the
# file system's clock (coarse on Linux, 1-2 s on some file systems) and keep its mtime: not cached yet.
RACY_SECONDS = 2.0
# Every cached row is re-read in full after 150-300 s (spread, so a big stage is not re-read in one poll):
# a bound on what a client's attribute cache (NFS) or a skewed server clock could hide.
MAX_AGE_SECONDS = 300.0


class _Row:
    """One attempt as the report shows it; kept in the cache only once the attempt has ended."""

    __slots__ = ("attempt", "created", "phases", "reason", "report")

    def __init__(self, attempt: Attempt, report: dict[str, Any], phases: dict[str, float | None] | None,
                 reason: Any, created: Any) -> None:
        self.attempt, self.report, self.phases, self.reason, self.created = attempt, report, phases, reason, created


class _Listing:
    """What a subtask directory held: its attempt numbers and its admitted.json marker."""

    __slots__ = ("marker", "numbers")

    def __init__(self, numbers: list[int], marker: Any) -> None:
        self.numbers, self.marker = numbers, marker


class _Cache:
    """A bounded LRU of stat-keyed entries, shared by the api-server's threads."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._items: OrderedDict[tuple[str, str], tuple[tuple[int, int, int], float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], seen: tuple[int, int, int], now_mono: float) -> Any:
        """The value cached for ``key`` under the same directory stat and not expired, else None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if item[0] != seen or now_mono >= item[1]:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[2]

    def put(self, key: tuple[str, str], seen: tuple[int, int, int], value: Any, now_mono: float) -> None:
        """Keep ``value`` for ``key`` while its directory's stat is ``seen``; evicts the least recently used."""
        expires = now_mono + MAX_AGE_SECONDS * (0.5 + random.random() / 2)  # spreading expiries, not a secret
        with self._lock:
            self._items[key] = (seen, expires, value)
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


_CACHE = _Cache(ENDED_CACHE_ENTRIES)


def clear_cache() -> None:
    """Forget every cached attempt row and subtask listing of this process."""
    _CACHE.clear()


def _dir_stat(path: str) -> tuple[tuple[int, int, int], int] | None:
    """(inode, mtime, ctime) of a directory and its mtime, or None when it is not a directory."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_ctime_ns), info.st_mtime_ns


class _AttemptReader:
    """Reads one stage's subtasks for a report, through the process-wide cache of ended attempts."""

    def __init__(self, layout: StageLayout, backend: Backend, liveness: str, now: float) -> None:
        self.layout, self.backend, self.liveness, self.now = layout, backend, liveness, now
        # Plain strings: pathlib and safe_component per path cost more than the stats of a cached poll.
        self.stage_dir = str(layout.dir)
        self.mono = time.monotonic()
        # Compared with file system timestamps, so the real clock, never the caller's ``now``.
        self.racy_before_ns = time.time_ns() - int(RACY_SECONDS * 1e9)

    def subtask(self, subtask: int) -> tuple[list[_Row], Any]:
        """The attempts (with a claim) of ``subtask`` in ascending order, and its admitted.json marker."""
        base = os.path.join(self.stage_dir, f"subtask={subtask}")
        seen = _dir_stat(base)
        if seen is None:
            return [], None
        key = (base, "listing")
        listing = _CACHE.get(key, seen[0], self.mono)
        if listing is None:
            names = os.listdir(base)
            numbers = []
            for name in names:
                if name.startswith("attempt="):
                    with contextlib.suppress(ValueError):
                        numbers.append(int(name.split("=", 1)[1]))
            marker = read_json(os.path.join(base, ADMITTED_FILE)) if ADMITTED_FILE in names else None
            listing = _Listing(sorted(numbers), marker)
            if seen[1] < self.racy_before_ns:
                _CACHE.put(key, seen[0], listing, self.mono)
        rows = []
        for number in listing.numbers:
            row = self._attempt(subtask, number, os.path.join(base, f"attempt={number}"))
            if row is not None:
                rows.append(row)
        return rows, listing.marker

    def _attempt(self, subtask: int, number: int, base: str) -> _Row | None:
        """One attempt's row (None without a claim); from the cache if it ended and its directory is unchanged."""
        seen = _dir_stat(base)
        key = (base, self.liveness)
        if seen is not None:
            row = _CACHE.get(key, seen[0], self.mono)
            if row is not None:
                return row  # type: ignore[no-any-return]
        claim = read_json(os.path.join(base, CLAIM_FILE))
        if claim is None:
            return None
        a = self.backend.poll(subtask, number, self.now)
        status = read_json(os.path.join(base, STATUS_FILE)) or {}
        phases = (attempt_phases(a.created_at, a.deploying_at, a.end_at,
                                 (read_json(os.path.join(base, MANIFEST_FILE)) or {}).get("timings"))
                  if a.end_at is not None else None)
        report = {
            "attempt": a.number, "state": a.state.value, "target": a.target, "node": a.node,
            "speculative": a.speculative, "start": a.deploying_at, "end": a.end_at, "exit_code": a.exit_code,
            "cause": a.cause, "admitted": False,
            "app_id": a.app_id, "launched_at": a.launched_at, "startup_seconds": a.startup_seconds,
            "duration": ((a.end_at or self.now) - a.deploying_at) if a.deploying_at else None,
            "phases": phases,
            "last_seen": last_sign_of_life(status, read_json(os.path.join(base, HEARTBEAT_FILE)) or {}),
        }
        row = _Row(a, report, phases, claim.get("reason"), claim.get("created_at"))
        # The stat was taken before the reads: a change made while reading leaves a stale key, never a stale row.
        if (seen is not None and seen[1] < self.racy_before_ns and status.get("state") in TERMINAL
                and status.get("end_at") is not None and a.end_at is not None):
            _CACHE.put(key, seen[0], row, self.mono)
        return row


class _Journal:
    """The records of one stage's journal read so far and the store's cursor after them (it only grows)."""

    __slots__ = ("cursor", "records", "tail")

    def __init__(self) -> None:
        self.cursor: str | None = None
        self.records: list[dict[str, Any]] = []
        # The record of a last line still without its newline: returned, read again next time.
        self.tail: list[dict[str, Any]] = []


_JOURNALS: OrderedDict[tuple[str, str], _Journal] = OrderedDict()
_JOURNALS_LOCK = threading.Lock()
# Journals kept parsed (one per stage the UI looked at recently).
JOURNAL_CACHE_ENTRIES = 64


def journal_records(layout: StageLayout) -> list[dict[str, Any]]:
    """Every complete record of the stage's journal, as ``read_journal`` reads it; parses only what was appended."""
    store, name = layout.store, layout.name(layout.journal)
    key = (store.url, name)
    with _JOURNALS_LOCK:
        cached = _JOURNALS.pop(key, None)
    chunk = store.read_journal_from(name, cached.cursor if cached is not None else None)
    if cached is None or chunk.restarted:
        cached = _Journal()  # replaced, truncated or removed: what was read before is not in it any more
    cached.records.extend(chunk.records)
    cached.cursor, cached.tail = chunk.cursor, chunk.unterminated
    with _JOURNALS_LOCK:
        _JOURNALS[key] = cached
        while len(_JOURNALS) > JOURNAL_CACHE_ENTRIES:
            _JOURNALS.popitem(last=False)
    return cached.records + cached.tail


def _subtask_dirs(layout: StageLayout) -> set[int]:
    """The subtask numbers that have a directory in the stage's directory."""
    try:
        names = os.listdir(layout.dir)
    except OSError:
        return set()
    present = set()
    for name in names:
        if name.startswith("subtask="):
            try:
                present.add(int(name.split("=", 1)[1]))
            except ValueError:
                continue
    return present


def speed_line(summary: StageSummary) -> str | None:
    """Slow targets (and from what they are known), held originals, and where the baseline came from."""
    parts = []
    slow = {t: v for t, v in (summary.get("target_speeds") or {}).items()
            if isinstance(v, dict) and float(v.get("slowness") or 1.0) >= SLOW_FACTOR}
    if slow:
        parts.append("slow targets: " + ", ".join(f"{t} {float(v['slowness']):.1f}x ({v.get('source')})"
                                                   for t, v in sorted(slow.items())))
    if summary.get("held_subtasks"):
        parts.append(f"{summary['held_subtasks']} original attempt(s) waiting for a faster target")
    baseline = summary.get("baseline_seconds")
    if baseline is not None:
        floor = summary.get("baseline_floor_seconds")
        parts.append(f"baseline {float(baseline):.1f}s ({summary.get('baseline_source')}"
                     + (f"; floor {float(floor):.1f}s from {summary.get('baseline_floor_source')}"
                        if floor is not None else "") + ")")
    return "; ".join(parts) or None


def input_wait_lines(summary: StageSummary) -> list[str]:
    """Hybrid inputs in words: admitted producer partitions per producer, and what waiting subtasks wait for."""
    lines = [f"hybrid input from {stage}: producer partitions {info.get('admitted')}/{info.get('parallelism')} "
             f"admitted" + (" (committed)" if info.get("committed") else "")
             for stage, info in sorted((summary.get("hybrid_inputs") or {}).items())]
    waiting = int(summary.get("waiting_for_inputs") or 0)
    examples = summary.get("input_waits") or {}
    if waiting:
        first = min(examples, key=int) if examples else None
        lines.append(f"{waiting} subtask{'s' if waiting > 1 else ''} waiting for producer partitions"
                     + (f"; subtask {first}: {examples[first]}" if first is not None else ""))
    return lines


def _stage_failed(journal: list[dict[str, Any]], committed: bool) -> bool:
    """The controller's last notable journal event is ``stage_failed`` and nothing was committed since."""
    if committed:
        return False
    events = [e for e in journal if not is_routine(e.get("event"))]
    return bool(events) and events[-1].get("event") == Event.STAGE_FAILED


def stage_progress(stage: dict[str, Any]) -> dict[str, Any]:
    """A stage's progress from its report: admitted/total, running, live speculative and slow attempts."""
    live = [a for s in stage["subtasks"] for a in s["attempts"] if a["state"] in LIVE]
    admitted = sum(1 for s in stage["subtasks"] if s["admitted"] is not None or s["reused"])
    state = ("committed" if stage["committed"] else "failed" if stage.get("failed")
             else "running" if live else "waiting")
    return {"stage": stage["stage"], "state": state, "admitted": admitted, "total": stage["parallelism"],
            "running": len(live), "speculative": sum(1 for a in live if a["speculative"]),
            "slow": stage.get("numSlowExecutionVertices", 0)}


def run_progress(report: dict[str, Any]) -> dict[str, Any]:
    """Per-stage progress, the consumers not planned yet, and whether nothing in the run can change any more."""
    stages = [stage_progress(s) for s in report["stages"]]
    names = {s["stage"] for s in report["stages"]}
    pending = sorted({c for s in report["stages"] for c in s["consumers"]} - names)
    failed = any(s["state"] == "failed" for s in stages)
    all_committed = bool(stages) and not pending and all(s["state"] == "committed" for s in stages)
    # A failed stage's consumers never plan: the run is over once nothing else still runs.
    over = failed and not any(s["state"] == "running" for s in stages)
    return {"stages": stages, "pending_stages": pending, "done": all_committed or over,
            "all_committed": all_committed, "failed": failed}
