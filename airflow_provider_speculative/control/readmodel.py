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

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

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
from airflow_provider_speculative.store.backend import ObjectInfo, StoreBackend
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
    shown_root,
    stage_key,
    store_at,
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
    return _checked_plan(read_json(path), path)


def _checked_plan(plan: Any, where: object) -> dict[str, Any]:
    if not isinstance(plan, dict) or not all(k in plan for k in ("stage", "parallelism", "store_root")):
        raise StoreError(f"{where} is not a stage plan (missing stage, parallelism or store_root); "
                         "it was damaged or written by something else")
    return plan


def read_document(store: StoreBackend, name: str) -> Any:
    """The JSON document ``name``, None if missing; StoreError naming it if it is corrupt or not a plain object.

    ``read`` and not POSIX's ``read_json``: the same refusals of a link or a FIFO in place of the document, in
    one open instead of one per directory on the way (seven for an attempt's file, on every attempt of a
    poll). The directories below a stage are found by listings, which never follow a link.
    """
    return store.read_document(name)


def _prefixes(entries: list[str], label: str) -> list[tuple[str, int]]:
    """``(entry, n)`` of the sub-prefixes ``<label>=<n>/`` among ``children`` entries (a link is not one)."""
    found = []
    for entry in entries:
        if entry.startswith(f"{label}=") and entry.endswith("/"):
            try:
                found.append((entry[:-1], int(entry[len(label) + 1:-1])))
            except ValueError:
                continue
    return found


def _run_prefix(dag_id: str, run_id: str) -> str:
    return f"{safe_component(dag_id)}/{safe_component(run_id)}"


def _stage_plans(store: StoreBackend, run: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, plan) of every stage prefix of the run holding a plan.json, by stage directory name."""
    plans = []
    for entry in store.children(run):
        if entry.endswith("/"):
            name = f"{run}/{entry}{PLAN_FILE}"
            plan = read_document(store, name)
            if plan is not None:
                plans.append((name, _checked_plan(plan, store.describe(name))))
    return plans


def _opened(root: Path | StoreBackend, store: StoreBackend | None) -> StoreBackend:
    """The store to read: ``store``, else ``root``'s (a backend, a StorePath's store, a POSIX directory's)."""
    return store_at(root) if store is None else store


def run_plans(root: Path | StoreBackend, dag_id: str, run_id: str, *,
              store: StoreBackend | None = None) -> dict[str, dict[str, Any]]:
    """Every stage planned in the run (store key -> plan.json), empty when none is.

    Keyed by store key (the stage name, or the task id in a pipeline compiled as a TaskGroup): two grouped
    pipelines of one DAG may both have a stage of a name. ``store``: the store ``root`` names (default: its
    POSIX directory).
    """
    store = _opened(root, store)
    return {stage_key(plan): plan for _, plan in _stage_plans(store, _run_prefix(dag_id, run_id))}


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


def latest_run_id(root: Path | StoreBackend, dag_id: str, *, store: StoreBackend | None = None) -> str:
    """The run of ``dag_id`` whose stages were planned last in the store (its plan.json is the newest)."""
    store = _opened(root, store)
    dag = safe_component(dag_id)
    newest: tuple[float, str] | None = None
    for run in store.children(dag):
        if not run.endswith("/"):
            continue
        for stage in store.children(f"{dag}/{run[:-1]}"):
            if not stage.endswith("/"):
                continue
            name = f"{dag}/{run}{stage}{PLAN_FILE}"
            info = store.stat(name)
            if info is not None and (newest is None or info.mtime > newest[0]):
                newest = (info.mtime, name)
    if newest is None:
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} under {shown_root(store)}")
    return str(_checked_plan(read_document(store, newest[1]), store.describe(newest[1]))["run_id"])


def run_report(root: Path | StoreBackend, dag_id: str, run_id: str, stage: str | None = None, *,
               liveness: str = "process", now: float | None = None, with_claims: bool = False,
               store: StoreBackend | None = None) -> dict[str, Any]:
    """Stages (in plan order) -> subtasks -> attempts for one DAG run (``with_claims``: see stage_report)."""
    backend = _opened(root, store)
    run = _run_prefix(dag_id, run_id)
    found = _stage_plans(backend, run)
    # An empty run directory is a run with no stage yet; a missing one is not recorded at all (an object
    # store has no empty prefix: there both are "not recorded").
    if not found and not backend.children(run) and backend.prefix_version(run) is None:
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} run {run_id!r} "
                            f"under {shown_root(backend)}")
    stages = []
    plans = [plan for _, plan in found]
    if stage:
        stage = find_stage_key({stage_key(p): p for p in plans}, stage, f"dag {dag_id!r} run {run_id!r}")
    for plan in pipeline_order(plans):
        if stage and stage_key(plan) != stage:
            continue
        # The layout is over the store read, not over the root the plan recorded: a store mounted elsewhere
        # since, or an S3 store, is read where it is.
        stages.append(stage_report(StageLayout.over(backend, dag_id, run_id, stage_key(plan)), plan,
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
                 now: float | None = None, with_claims: bool = False, store: StoreBackend | None = None,
                 poller: Backend | None = None) -> dict[str, Any]:
    """One stage: summary, committed flag and every subtask's attempts with the current one.

    ``with_claims`` adds each attempt's claim ``reason`` and ``created`` (what the UI shows), read with the
    attempt instead of once more per poll. ``store`` is where the stage's objects are read by name (default:
    the layout's store) and ``poller`` what polls an attempt (default: the ``liveness`` mode's).
    """
    now = time.time() if now is None else now
    backend = observer(layout, liveness) if poller is None else poller
    store = layout.store if store is None else store
    stage_name = layout.name(layout.dir)
    summary: StageSummary = read_document(store, f"{stage_name}/{layout.summary.name}") or StageSummary()
    committed = read_document(store, f"{stage_name}/{layout.committed.name}")
    journal = journal_records(layout, store=store)
    reused = set(summary.get("reused") or [])
    input_waits = summary.get("input_waits") or {}
    subtasks = []
    admitted_phases = []
    reader = _AttemptReader(store, stage_name, backend, liveness, now)
    # One listing of the stage: a subtask without a prefix has no attempt and no admission, so its names
    # are not built and probed one by one (32,768 of them took seconds on every poll).
    present = reader.subtasks()
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
# changes only when an object right in its prefix is created, replaced (every JSON file is renamed over) or
# removed (invalidated.json, a loser's manifest, gc). So its report row is kept per process, keyed by its
# prefix's version (_Index): on POSIX the directory's stat, which each of those changes moves (inode, mtime,
# ctime), so a poll costs one stat per ended attempt plus one per subtask directory (new attempts,
# admitted.json created, replaced or removed); on a backend without directories, what one listing of the
# whole stage says of the objects right in the prefix (name, size, mtime, ETag), so a poll costs that one
# listing. Rows of attempts that have not ended are never kept: their answer depends on the clock.
# A row is a few KB: two stages of the 32,768-subtask maximum, bounded to a couple of hundred MB of an
# api-server's memory; beyond it the least recently polled rows are read again.
ENDED_CACHE_ENTRIES = 65_536
# A prefix changed within this many seconds of being read may change again within the same tick of the
# file system's clock (coarse on Linux, 1-2 s on some file systems) and keep its mtime: not cached yet.
# Objects with an ETag need no such wait (another write is another ETag).
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
    """What a subtask prefix held: its attempt numbers and its admitted.json marker."""

    __slots__ = ("marker", "numbers")

    def __init__(self, numbers: list[int], marker: Any) -> None:
        self.numbers, self.marker = numbers, marker


class _Cache:
    """A bounded LRU of version-keyed entries, shared by the api-server's threads."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._items: OrderedDict[tuple[str, ...], tuple[Hashable, float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, ...], seen: Hashable, now_mono: float) -> Any:
        """The value cached for ``key`` under the same prefix version and not expired, else None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if item[0] != seen or now_mono >= item[1]:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[2]

    def put(self, key: tuple[str, ...], seen: Hashable, value: Any, now_mono: float) -> None:
        """Keep ``value`` for ``key`` while its prefix's version is ``seen``; evicts the least recently used."""
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


class _Version(NamedTuple):
    """A prefix's version for the cache, and whether it may be cached (no change can hide behind it)."""

    key: Hashable
    cacheable: bool


class _Index:
    """A stage's subtasks and attempts as found on a backend with directories: a listing or a stat per prefix."""

    def __init__(self, store: StoreBackend, stage: str, racy_before: float) -> None:
        self.store, self.stage, self.racy_before = store, stage, racy_before

    def entries(self, prefix: str) -> list[str]:
        """The entries right below ``prefix`` (sub-prefixes end with ``/``)."""
        return self.store.children(prefix)

    def version(self, prefix: str) -> _Version | None:
        """The prefix's version, None when it is not there (or not a directory of its own)."""
        found = self.store.prefix_version(prefix)
        return None if found is None else _Version(found.key, found.changed_at < self.racy_before)


class _ListedIndex(_Index):
    """The same from one listing of the whole stage prefix, with each object's size, mtime and ETag (S3)."""

    def __init__(self, store: StoreBackend, stage: str, racy_before: float) -> None:
        super().__init__(store, stage, racy_before)
        self._objects: dict[str, list[ObjectInfo]] = {}
        self._below: dict[str, set[str]] = {}
        start = len(stage) + 1
        for info in store.stat_all(stage):
            parts = info.name[start:].split("/", 2)
            if len(parts) < 2 or not parts[0].startswith("subtask="):
                continue
            subtask = f"{stage}/{parts[0]}"
            self._below.setdefault(stage, set()).add(parts[0] + "/")
            if len(parts) == 2:
                self._objects.setdefault(subtask, []).append(info)
                continue
            attempt = f"{subtask}/{parts[1]}"
            self._below.setdefault(subtask, set()).add(parts[1] + "/")
            if "/" in parts[2]:
                self._below.setdefault(attempt, set()).add(parts[2].split("/", 1)[0] + "/")  # data/…: not read
            else:
                self._objects.setdefault(attempt, []).append(info)

    def entries(self, prefix: str) -> list[str]:
        """The entries right below ``prefix``, from the listing."""
        objects = [info.name.rsplit("/", 1)[-1] for info in self._objects.get(prefix, [])]
        return sorted(objects + list(self._below.get(prefix, ())))

    def version(self, prefix: str) -> _Version | None:
        """What the listing says of the objects right in ``prefix``, and of its sub-prefixes."""
        objects = self._objects.get(prefix, [])
        below = self._below.get(prefix)
        if not objects and below is None:
            return None
        key = (tuple((i.name, i.size, i.mtime, i.etag) for i in objects), tuple(sorted(below or ())))
        cacheable = all(i.etag is not None or i.mtime < self.racy_before for i in objects)
        return _Version(key, cacheable)


class _AttemptReader:
    """Reads one stage's subtasks for a report, through the process-wide cache of ended attempts."""

    def __init__(self, store: StoreBackend, stage: str, backend: Backend, liveness: str, now: float) -> None:
        self.store, self.stage, self.backend, self.liveness, self.now = store, stage, backend, liveness, now
        self.url = store.url  # in every cache key: computed once, not per prefix
        self.mono = time.monotonic()
        # Compared with the store's timestamps, so the real clock, never the caller's ``now``.
        racy_before = time.time() - RACY_SECONDS
        # A backend with directories versions each prefix by its stat; any other lists the stage once.
        self.index = (_Index(store, stage, racy_before) if store.prefix_version("") is not None
                      else _ListedIndex(store, stage, racy_before))

    def subtasks(self) -> set[int]:
        """The subtask numbers that have a prefix in the stage (one listing)."""
        return {n for _, n in _prefixes(self.index.entries(self.stage), "subtask")}

    def subtask(self, subtask: int) -> tuple[list[_Row], Any]:
        """The attempts (with a claim) of ``subtask`` in ascending order, and its admitted.json marker."""
        base = f"{self.stage}/subtask={subtask}"
        seen = self.index.version(base)
        if seen is None:
            return [], None
        key = (self.url, base, "listing")
        listing = _CACHE.get(key, seen.key, self.mono)
        if listing is None:
            entries = self.index.entries(base)
            marker = read_document(self.store, f"{base}/{ADMITTED_FILE}") if ADMITTED_FILE in entries else None
            listing = _Listing(sorted(n for _, n in _prefixes(entries, "attempt")), marker)
            if seen.cacheable:
                _CACHE.put(key, seen.key, listing, self.mono)
        rows = []
        for number in listing.numbers:
            row = self._attempt(subtask, number, f"{base}/attempt={number}")
            if row is not None:
                rows.append(row)
        return rows, listing.marker

    def _attempt(self, subtask: int, number: int, base: str) -> _Row | None:
        """One attempt's row (None without a claim); from the cache if it ended and its prefix is unchanged."""
        seen = self.index.version(base)
        key = (self.url, base, self.liveness)
        if seen is not None:
            row = _CACHE.get(key, seen.key, self.mono)
            if row is not None:
                return row  # type: ignore[no-any-return]
        claim = read_document(self.store, f"{base}/{CLAIM_FILE}")
        if claim is None:
            return None
        a = self.backend.poll(subtask, number, self.now)
        status = read_document(self.store, f"{base}/{STATUS_FILE}") or {}
        phases = (attempt_phases(a.created_at, a.deploying_at, a.end_at,
                                 (read_document(self.store, f"{base}/{MANIFEST_FILE}") or {}).get("timings"))
                  if a.end_at is not None else None)
        report = {
            "attempt": a.number, "state": a.state.value, "target": a.target, "node": a.node,
            "speculative": a.speculative, "start": a.deploying_at, "end": a.end_at, "exit_code": a.exit_code,
            "cause": a.cause, "admitted": False,
            "app_id": a.app_id, "launched_at": a.launched_at, "startup_seconds": a.startup_seconds,
            "duration": ((a.end_at or self.now) - a.deploying_at) if a.deploying_at else None,
            "phases": phases,
            "last_seen": last_sign_of_life(status, read_document(self.store, f"{base}/{HEARTBEAT_FILE}") or {}),
        }
        row = _Row(a, report, phases, claim.get("reason"), claim.get("created_at"))
        # The version was taken before the reads: a change made while reading leaves a stale key, never a stale row.
        if (seen is not None and seen.cacheable and status.get("state") in TERMINAL
                and status.get("end_at") is not None and a.end_at is not None):
            _CACHE.put(key, seen.key, row, self.mono)
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


def journal_records(layout: StageLayout, *, store: StoreBackend | None = None) -> list[dict[str, Any]]:
    """Every complete record of the stage's journal, as ``read_journal`` reads it; parses only what was appended."""
    store, name = layout.store if store is None else store, layout.name(layout.journal)
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
