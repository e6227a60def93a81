"""Read a DAG run's stages, subtasks and attempts from the store (for the CLI and the UI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.base import attempt_observer
from airflow_provider_speculative.control.lifecycle import read_expired
from airflow_provider_speculative.core.states import current_attempt
from airflow_provider_speculative.exceptions import NotFoundError, StoreError
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout, safe_component


def read_plan(path: Path) -> dict[str, Any]:
    """A stage's plan.json; :class:`StoreError` naming the file if it is corrupt or not a stage plan."""
    plan = read_json(path)
    if not isinstance(plan, dict) or not all(k in plan for k in ("stage", "parallelism", "store_root")):
        raise StoreError(f"{path} is not a stage plan (missing stage, parallelism or store_root); "
                         "it was damaged or written by something else")
    return plan


def run_report(root: Path, dag_id: str, run_id: str, stage: str | None = None) -> dict[str, Any]:
    """Stages (in plan order) -> subtasks -> attempts for one DAG run."""
    run_dir = Path(root) / safe_component(dag_id) / safe_component(run_id)
    if not run_dir.is_dir():
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} run {run_id!r} under {root}")
    stages = []
    for stage_dir in sorted(p for p in run_dir.iterdir() if (p / "plan.json").is_file()):
        plan = read_plan(stage_dir / "plan.json")
        if stage and plan["stage"] != stage:
            continue
        stages.append(stage_report(StageLayout(Path(plan["store_root"]), dag_id, run_id, plan["stage"]), plan))
    if stage and not stages:
        raise NotFoundError(f"stage {stage!r} not found in dag {dag_id!r} run {run_id!r}")
    order = {s["stage"]: i for i, s in enumerate(stages)}
    for s in stages:
        order[s["stage"]] = max([order.get(u, 0) + 1 for u in s["upstreams"]] + [0])
    stages.sort(key=lambda s: (order[s["stage"]], s["stage"]))
    return {"dag_id": dag_id, "run_id": run_id, "stages": stages}


def stage_report(layout: StageLayout, plan: dict[str, Any]) -> dict[str, Any]:
    """One stage: summary, committed flag and every subtask's attempts with the current one."""
    backend = attempt_observer(layout)
    summary = read_json(layout.summary) or {}
    committed = read_json(layout.committed)
    subtasks = []
    for subtask in range(plan["parallelism"]):
        attempts = [backend.poll(subtask, n) for n in layout.attempt_numbers(subtask)
                    if layout.claim(subtask, n).exists()]
        marker = read_json(layout.admitted(subtask))
        current = current_attempt(attempts)
        subtasks.append({
            "subtask": subtask,
            "admitted": marker["attempt"] if marker else None,
            "current": current.number if current else None,
            "reused": subtask in (plan.get("reused") or []),
            "attempts": [{
                "attempt": a.number, "state": a.state.value, "target": a.target, "node": a.node,
                "speculative": a.speculative, "start": a.deploying_at, "end": a.end_at, "exit_code": a.exit_code,
                "cause": a.cause, "admitted": bool(marker and marker["attempt"] == a.number),
                "app_id": a.app_id, "launched_at": a.launched_at, "startup_seconds": a.startup_seconds,
            } for a in attempts],
        })
    return {
        "stage": plan["stage"], "parallelism": plan["parallelism"], "upstreams": plan.get("upstreams", []),
        "consumers": plan.get("consumers", []), "committed": committed is not None,
        # Set once gc removed the committed data (FLIP-1 life cycle): a consumer rerun finds it missing.
        "expired": read_expired(layout),
        "sink": (committed or {}).get("sink"), "speculation": summary.get("speculation"),
        "numSlowExecutionVertices": summary.get("numSlowExecutionVertices", 0),
        "numEffectiveSpeculativeExecutions": summary.get("numEffectiveSpeculativeExecutions", 0),
        "blocked_nodes": summary.get("blocked_nodes", {}), "baseline_seconds": summary.get("baseline_seconds"),
        "subtasks": subtasks, "journal_events": len(read_jsonl(layout.journal)),
    }
