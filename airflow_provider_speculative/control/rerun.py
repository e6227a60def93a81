"""Explicit reruns of a region of a DAG run: compute it from the recorded plans and invalidate exactly it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.control.readmodel import find_stage_key, run_plans
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.failover import Region, rerun_region
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.exceptions import NotFoundError
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.identity import own_run
from airflow_provider_speculative.store.layout import StageLayout, shown_root, stage_key, store_at
from airflow_provider_speculative.store.results import remove_attempt_output

# A store root as a path (POSIX, or a layout's StorePath) or the store's backend.
StoreRoot = Path | StoreBackend

# The event of the audit-log rows a rerun writes (Airflow's Log.event, at most 60 characters).
AUDIT_EVENT = "speculative_rerun"


def graph_from_plans(root: StoreRoot, dag_id: str, run_id: str) -> tuple[PipelineGraph, dict[str, dict[str, Any]]]:
    """Rebuild the stage graph of a run from its plan.json files (what actually ran).

    Its stages are named by store key (the task id in a pipeline compiled as a TaskGroup), so the stages of
    every pipeline of the DAG run are one graph without two of them sharing a name.
    """
    plans = run_plans(root, dag_id, run_id)
    if not plans:
        raise NotFoundError(f"no speculative stages recorded for dag {dag_id!r} run {run_id!r} "
                            f"under {shown_root(store_at(root))}")
    stages = {}
    for name, plan in plans.items():
        inputs: dict[str, SourceSpec | ExchangeSpec] = {}
        for input_name, entry in (plan.get("inputs") or {}).items():
            upstream = stage_key(plan, entry["upstream"]) if entry["kind"] == "exchange" else None
            if upstream is not None and upstream in plans:
                inputs[input_name] = ExchangeSpec(upstream, entry["distribution"], ("_",),
                                                  entry.get("mode", "blocking"))
            else:
                inputs[input_name] = SourceSpec(entry.get("schema_file", ""))
        stages[name] = StageSpec(name, plan.get("application", ""), plan["parallelism"], inputs,
                                 max_parallelism=plan["max_parallelism"], deterministic=plan.get("deterministic", True))
    return PipelineGraph(name=dag_id, stages=stages), plans


def plan_rerun(root: StoreRoot, dag_id: str, run_id: str, stage: str, subtasks: list[int] | None,
               downstream: bool = True) -> Region:
    """The region a rerun of ``stage`` (some or all subtasks) affects, with the run's failover strategy.

    ``downstream``: include the consumers of the rerun subtasks, transitively (see ``rerun_region``).
    """
    graph, plans = graph_from_plans(root, dag_id, run_id)
    stage = find_stage_key(plans, stage, f"dag {dag_id!r} run {run_id!r}")
    if stage not in graph.stages:
        raise NotFoundError(f"stage {stage!r} not found in dag {dag_id!r} run {run_id!r} (stages: {', '.join(plans)})")
    parallelism = int(plans[stage]["parallelism"])
    bad = [s for s in subtasks or [] if not 0 <= s < parallelism]
    if bad:
        raise ValueError(f"stage {stage!r} has subtasks 0..{parallelism - 1}; no subtask {bad}")
    strategy = plans[stage]["config"].get("failover_strategy", "region")
    return rerun_region(graph, stage, set(subtasks) if subtasks else None, strategy, downstream=downstream,
                        in_flight=in_flight_reads(root, dag_id, run_id, graph))


def in_flight_reads(root: StoreRoot, dag_id: str, run_id: str, graph: PipelineGraph) -> dict[str, dict[int, Any]]:
    """Consumers of hybrid edges: what each live attempt recorded reading (its heartbeat), by stage and subtask.

    Reads only the stages fed by a hybrid edge, and of them only attempts that are not finished.
    """
    out: dict[str, dict[int, Any]] = {}
    hybrid = {c for name in graph.stages for c, _, spec in graph.consumers(name) if spec.mode == "hybrid"}
    for stage in sorted(hybrid):
        layout = StageLayout.at(root, dag_id, run_id, stage)
        # An attempt records its producers by stage name; the graph names them by store key.
        plan = layout.read_json(layout.plan) or {"stage": stage}
        observer = attempt_observer(layout)
        for subtask in range(plans_parallelism(graph, stage)):
            for number in layout.attempt_numbers(subtask):
                attempt = observer.poll(subtask, number)
                if attempt.live and attempt.progress.get("reads"):
                    merged = out.setdefault(stage, {}).setdefault(subtask, {})
                    for producer, reads in attempt.progress["reads"].items():
                        merged.setdefault(stage_key(plan, producer), {}).update(reads)
    return out


def stage_task_ids(stages: list[str], task_ids: list[str]) -> dict[str, str]:
    """Stage -> the Airflow task id that runs it among ``task_ids`` (the stage name, or ``group.stage``).

    ``stages`` are store keys: a stage of a pipeline compiled as a TaskGroup is keyed by its task id, so it
    matches exactly; a stage keyed by its name matches its task id or, in a task group made by hand,
    ``group.stage``.
    """
    found: dict[str, str] = {}
    for stage in stages:
        exact = [t for t in task_ids if t == stage]
        grouped = sorted(t for t in task_ids if t.rsplit(".", 1)[-1] == stage and t != stage)
        if exact or grouped:
            found[stage] = (exact or grouped)[0]
    return found


def invalidate_region(root: StoreRoot, dag_id: str, run_id: str, region: Region, reason: str) -> dict[str, list[int]]:
    """Withdraw the admitted attempts of the region and the stages' commits; return what was invalidated."""
    done: dict[str, list[int]] = {}
    first = next(iter(region.subtasks), None)
    if first is not None:
        # Before anything is withdrawn (one prefix covers the run): a run this store cannot own keeps it all.
        own_run(StageLayout.at(root, dag_id, run_id, first))
    for stage, subtasks in region.subtasks.items():
        layout = StageLayout.at(root, dag_id, run_id, stage)
        backend = attempt_observer(layout)
        for subtask in sorted(subtasks):
            marker = layout.read_json(layout.admitted(subtask))
            if marker is None:
                continue
            backend.invalidate(subtask, marker["attempt"], reason)
            remove_attempt_output(layout, subtask, marker["attempt"])
            done.setdefault(stage, []).append(subtask)
        # The stage must commit again; consumers re-plan from the new commit.
        layout.delete(layout.committed)
        journal.record_stage(layout, Event.RERUN_INVALIDATED, subtasks=sorted(subtasks), reason=reason)
    return done


def plans_parallelism(graph: PipelineGraph, stage: str) -> int:
    """A planned stage's subtask count (graph_from_plans records the decided one)."""
    parallelism = graph.stages[stage].parallelism
    if not isinstance(parallelism, int):
        raise ValueError(f"stage {stage!r}: parallelism {parallelism!r} is not decided")
    return parallelism


def request_rerun(root: StoreRoot, dag_id: str, run_id: str, stage: str, subtasks: list[int] | None, *,
                  downstream: bool, dry_run: bool, by: str, owner: str | None = None) -> dict[str, Any]:
    """A rerun as the CLI and the UI ask for it: the region, and unless ``dry_run`` its invalidation and cleared tasks.

    ``by`` says who asked (the CLI command or the UI user); it goes into every invalidated stage's journal.
    ``owner`` is the user Airflow's audit log names for each cleared task.
    """
    region = plan_rerun(root, dag_id, run_id, stage, subtasks, downstream=downstream)
    affected = {name: sorted(subs) for name, subs in region.subtasks.items()}
    result: dict[str, Any] = {
        "dag_id": dag_id, "run_id": run_id, "stage": stage, "region": affected,
        "requested": {name: sorted(subs) for name, subs in region.requested.items()},
        "downstream": {name: sorted(subs) for name, subs in region.downstream().items()},
        "in_flight": {name: sorted(subs) for name, subs in region.in_flight.items()},
        "no_downstream": not downstream, "dry_run": dry_run}
    if not dry_run:
        result["invalidated"] = invalidate_region(root, dag_id, run_id, region, by)
        result["stage_tasks"] = clear_stage_tasks(dag_id, run_id, list(affected), owner=owner, region=affected)
        result["cleared_tasks"] = sorted(result["stage_tasks"].values())
    return result


def clear_stage_tasks(dag_id: str, run_id: str, stages: list[str], *, owner: str | None = None,
                      region: dict[str, list[int]] | None = None) -> dict[str, str]:
    """Clear exactly the task instances that run ``stages`` in the run (stage -> task id cleared).

    Only these: no downstream task, no other run. The run goes back to queued if it had finished, so
    the scheduler runs them again. Each cleared task gets a ``speculative_rerun`` row in Airflow's audit
    log (the Audit Log view) in the same transaction, naming ``owner`` and the rerun subtasks, as
    Airflow's own Clear records its action.
    """
    from airflow.models.log import Log
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        all_ids = list(session.scalars(select(TaskInstance.task_id).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)))
        chosen = stage_task_ids(stages, all_ids)
        tis = list(session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
            TaskInstance.task_id.in_(list(chosen.values())), TaskInstance.map_index == -1)))
        clear_task_instances(tis, session)
        cleared = {ti.task_id for ti in tis}
        result = {name: task for name, task in chosen.items() if task in cleared}
        for name, task in sorted(result.items()):
            session.add(Log(event=AUDIT_EVENT, owner=owner, dag_id=dag_id, run_id=run_id, task_id=task,
                            extra=json.dumps({"stage": name, "subtasks": (region or {}).get(name)})))
        return result
