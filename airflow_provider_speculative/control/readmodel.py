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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import Backend
from airflow_provider_speculative.backends.registry import attempt_observer, heartbeat_observer
from airflow_provider_speculative.control.lifecycle import read_expired
from airflow_provider_speculative.core.breakdown import attempt_phases, breakdown_line, stage_breakdown
from airflow_provider_speculative.core.graph import producers_first
from airflow_provider_speculative.core.parallelism import describe_decision, skew_message
from airflow_provider_speculative.core.speed import SLOW_FACTOR
from airflow_provider_speculative.core.states import (  # noqa: F401  (the liveness rule, re-exported for the CLI)
    HEARTBEAT_STALE_AFTER,
    current_attempt,
    heartbeat_alive,
    last_sign_of_life,
)
from airflow_provider_speculative.exceptions import NotFoundError, PipelineError, StoreError
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout, safe_component

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
    """Every stage planned in the run (stage -> plan.json), empty when none is."""
    run_dir = Path(root) / safe_component(dag_id) / safe_component(run_id)
    plans = (read_plan(path) for path in sorted(run_dir.glob("*/plan.json")))
    return {str(plan["stage"]): plan for plan in plans}


def pipeline_order(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plans with every stage after its upstreams (then by name): the order a reader follows the pipeline."""
    by_name = {str(p["stage"]): p for p in plans}
    try:
        order = producers_first(sorted(by_name), lambda s: list(by_name[s].get("upstreams") or []), "status")
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
               liveness: str = "process", now: float | None = None) -> dict[str, Any]:
    """Stages (in plan order) -> subtasks -> attempts for one DAG run."""
    run_dir = Path(root) / safe_component(dag_id) / safe_component(run_id)
    if not run_dir.is_dir():
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} run {run_id!r} under {root}")
    stages = []
    plans = [read_plan(p / "plan.json") for p in sorted(run_dir.iterdir()) if (p / "plan.json").is_file()]
    for plan in pipeline_order(plans):
        if stage and plan["stage"] != stage:
            continue
        stages.append(stage_report(StageLayout(Path(plan["store_root"]), dag_id, run_id, plan["stage"]), plan,
                                   liveness=liveness, now=now))
    if stage and not stages:
        raise NotFoundError(f"stage {stage!r} not found in dag {dag_id!r} run {run_id!r}")
    order = {s["stage"]: i for i, s in enumerate(stages)}
    for s in stages:
        order[s["stage"]] = max([order.get(u, 0) + 1 for u in s["upstreams"]] + [0])
    stages.sort(key=lambda s: (order[s["stage"]], s["stage"]))
    return {"dag_id": dag_id, "run_id": run_id, "stages": stages}


def stage_report(layout: StageLayout, plan: Mapping[str, Any], *, liveness: str = "process",
                 now: float | None = None) -> dict[str, Any]:
    """One stage: summary, committed flag and every subtask's attempts with the current one."""
    now = time.time() if now is None else now
    backend = observer(layout, liveness)
    summary = read_json(layout.summary) or {}
    committed = read_json(layout.committed)
    subtasks = []
    admitted_phases = []
    # One listing of the stage directory: a subtask without a directory has no attempt and no admission, so
    # its paths are not built and probed one by one (32,768 of them took seconds on every poll).
    present = _subtask_dirs(layout)
    for subtask in range(plan["parallelism"]):
        if subtask not in present:
            attempts, marker = [], None
        else:
            attempts = [backend.poll(subtask, n, now) for n in layout.attempt_numbers(subtask)
                        if layout.claim(subtask, n).exists()]
            marker = read_json(layout.admitted(subtask))
        current = current_attempt(attempts)
        phases = {a.number: attempt_phases(a.created_at, a.deploying_at, a.end_at,
                                           (read_json(layout.manifest(subtask, a.number)) or {}).get("timings"))
                  for a in attempts if a.end_at is not None}
        if marker and marker["attempt"] in phases:
            admitted_phases.append(phases[marker["attempt"]])
        subtasks.append({
            "subtask": subtask,
            "admitted": marker["attempt"] if marker else None,
            "current": current.number if current else None,
            "reused": subtask in (summary.get("reused") or []),
            # Hybrid inputs: what a subtask without an attempt yet waits for (the first few, from the summary).
            "waiting_for": (summary.get("input_waits") or {}).get(str(subtask)),
            "attempts": [{
                "attempt": a.number, "state": a.state.value, "target": a.target, "node": a.node,
                "speculative": a.speculative, "start": a.deploying_at, "end": a.end_at, "exit_code": a.exit_code,
                "cause": a.cause, "admitted": bool(marker and marker["attempt"] == a.number),
                "app_id": a.app_id, "launched_at": a.launched_at, "startup_seconds": a.startup_seconds,
                "duration": ((a.end_at or now) - a.deploying_at) if a.deploying_at else None,
                "phases": phases.get(a.number),
                "last_seen": last_sign_of_life(read_json(layout.status(subtask, a.number)) or {},
                                               read_json(layout.heartbeat(subtask, a.number)) or {}),
            } for a in attempts],
        })
    return {
        "stage": plan["stage"], "parallelism": plan["parallelism"], "upstreams": plan.get("upstreams", []),
        "parallelism_decision": plan.get("parallelism_decision"),
        "parallelism_line": describe_decision(plan.get("parallelism_decision")),
        "plan_warnings": list(plan.get("warnings") or []),
        # Skew the plan split (splittable_skew); skew it could not split is among the warnings.
        "skew_splits": [f"input {e['input']!r}: {skew_message(e)}" for e in plan.get("exchange_skew") or []
                        if e.get("split", 1) > 1],
        "consumers": plan.get("consumers", []), "committed": committed is not None,
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
        "subtasks": subtasks, "journal_events": len(read_jsonl(layout.journal)),
        "hybrid_inputs": summary.get("hybrid_inputs") or {}, "input_waits": input_wait_lines(summary),
        "speed_line": speed_line(summary),
        "breakdown": stage_breakdown(admitted_phases),
        "breakdown_line": breakdown_line(stage_breakdown(admitted_phases), len(admitted_phases)),
        "failed": _stage_failed(layout, committed is not None),
    }


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


def speed_line(summary: dict[str, Any]) -> str | None:
    """Slow targets (and from what they are known), held originals, and where the baseline came from."""
    parts = []
    slow = {t: v for t, v in (summary.get("target_speeds") or {}).items()
            if isinstance(v, dict) and float(v.get("slowness") or 1.0) >= SLOW_FACTOR}
    if slow:
        parts.append("slow targets: " + ", ".join(f"{t} {float(v['slowness']):.1f}x ({v.get('source')})"
                                                   for t, v in sorted(slow.items())))
    if summary.get("held_subtasks"):
        parts.append(f"{summary['held_subtasks']} original attempt(s) waiting for a faster target")
    if summary.get("baseline_seconds") is not None:
        floor = summary.get("baseline_floor_seconds")
        parts.append(f"baseline {float(summary['baseline_seconds']):.1f}s ({summary.get('baseline_source')}"
                     + (f"; floor {float(floor):.1f}s from {summary.get('baseline_floor_source')}"
                        if floor is not None else "") + ")")
    return "; ".join(parts) or None


def input_wait_lines(summary: dict[str, Any]) -> list[str]:
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


def _stage_failed(layout: StageLayout, committed: bool) -> bool:
    """The controller's last notable journal event is ``stage_failed`` and nothing was committed since."""
    if committed:
        return False
    events = [e for e in read_jsonl(layout.journal) if e.get("event") not in ("launch", "admit")]
    return bool(events) and events[-1].get("event") == "stage_failed"


LIVE_STATES = frozenset({"CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING", "CANCELING"})


def stage_progress(stage: dict[str, Any]) -> dict[str, Any]:
    """A stage's progress from its report: admitted/total, running, live speculative and slow attempts."""
    live = [a for s in stage["subtasks"] for a in s["attempts"] if a["state"] in LIVE_STATES]
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
