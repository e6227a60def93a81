"""Run stages without Airflow: plan, drive the controller to the end and commit (benchmarks, debugging)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from airflow_provider_speculative.control.commit import admitted_of, commit_admitted, remove_losers
from airflow_provider_speculative.control.controller import StageController, wait_for_next_step, wipe_stage_attempts
from airflow_provider_speculative.control.planning import HybridWait, RunInfo, StagePlanner, TargetResolver
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.core.trigger_events import TriggerStatus
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.store import journal
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.identity import own_run
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.task_state import record_task_state


def local_spark_submit(master: str = "local[1]") -> list[str]:
    """``spark-submit`` for ``master`` (client mode): the one next to this interpreter if not on PATH."""
    local = Path(sys.executable).parent / "spark-submit"
    return [str(local) if local.exists() else (shutil.which("spark-submit") or "spark-submit"),
            "--master", master, "--conf", "spark.ui.enabled=false"]


def plan_local_stage(graph: PipelineGraph, stage: str, root: Path | StoreBackend, dag_id: str, run_id: str,
                     config: SpeculativeConfig, master: str = "local[1]") -> StagePlan:
    """Plan one stage for spark-submit attempts on ``master`` (sources listed from disk, upstreams committed).

    Each target's ``conf`` is added to its command line, so targets on a cluster master can pin their
    executors to a node (see docs/clusters.md).
    """
    def targets(config: SpeculativeConfig, application: str, spark_conf: dict[str, str], app_name: str,
                where: str) -> dict[str, dict[str, Any]]:
        def command(target_conf: dict[str, str]) -> list[str]:
            conf = {**target_conf, **spark_conf}
            return [*local_spark_submit(master), *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
                    application]

        return {t.name: {"kind": "spark_submit", "conn_id": t.conn_id, "node": t.node_label,
                         "command": command(t.conf), "env": {}, "spark_conf": {}} for t in config.targets}

    return _decide(graph, stage, root, dag_id, run_id, config, targets)


def plan_connect_stage(graph: PipelineGraph, stage: str, root: Path | StoreBackend, dag_id: str, run_id: str,
                       config: SpeculativeConfig) -> StagePlan:
    """Plan one stage for Spark Connect targets (``config.targets``; their servers' URLs go to :func:`run_stages`)."""
    def targets(config: SpeculativeConfig, application: str, spark_conf: dict[str, str], app_name: str,
                where: str) -> dict[str, dict[str, Any]]:
        return {t.name: {"kind": "spark_connect", "conn_id": t.conn_id, "node": t.node_label,
                         "command": [sys.executable, application], "env": {},
                         "spark_conf": {**t.conf, **spark_conf}} for t in config.targets}

    return _decide(graph, stage, root, dag_id, run_id, config, targets)


def _decide(graph: PipelineGraph, stage: str, root: Path | StoreBackend, dag_id: str, run_id: str,
            config: SpeculativeConfig, targets: TargetResolver) -> StagePlan:
    """The operator's planning (:class:`StagePlanner`: listing, checks, plan) with this runner's targets."""
    planner = StagePlanner(graph, stage, sink=None, declared_sink=None, config=config, root=root, targets=targets,
                           run=RunInfo(dag_id=dag_id, run_id=run_id, try_number=1, clear_number=0))
    planner.claim_run()  # a hybrid consumer records its wait in the run: the operator claims it first too
    hybrid = planner.hybrid_inputs()
    if isinstance(hybrid, HybridWait):
        waiting = ", ".join(sorted(w["stage"] for w in hybrid.inputs.values()))
        raise StoreError(f"{planner.where}: hybrid producer {waiting} has no usable plan under "
                         f"{planner.layout.store_root} yet (write the producer's plan first: write_plan)")
    return planner.decide(hybrid)


def write_plan(plan: StagePlan) -> StageLayout:
    """Write a stage's plan and journal it, as the operator does (hybrid consumers may plan on it then)."""
    layout = StageLayout.of_plan(plan)
    own_run(layout)  # as planning does before its first write: the run's removals are owned deletes
    layout.store.replace_json(layout.name(layout.plan), plan)
    journal.record_stage(layout, Event.PLAN_DECIDED, parallelism=plan["parallelism"],
                   decision=plan.get("parallelism_decision"))
    record_task_state(layout, TaskState.DEFERRED)
    return layout


def run_stages(plans: list[StagePlan], target_env: dict[str, dict[str, str]] | None = None,
               timeout: float = 1800.0) -> dict[str, StageController]:
    """Step the controllers of several written plans together (as concurrent Airflow tasks would); commit each.

    This is how stages joined by hybrid exchanges run at the same time without Airflow: the consumer's
    controller follows its producers' admissions in the store. Raises if a stage fails.
    """
    controllers = {plan["stage"]: StageController.open(plan, target_env=target_env) for plan in plans}
    deadline = time.monotonic() + timeout
    pending = dict(controllers)
    while pending:
        if time.monotonic() > deadline:
            for controller in pending.values():
                controller.kill_all("standalone run timed out")
            raise TimeoutError(f"stages {sorted(pending)} did not finish within {timeout}s")
        for name, controller in list(pending.items()):
            controller.step()
            if controller.done:
                del pending[name]
                _commit(controller)
        wait_for_next_step(list(pending.values()))
    return controllers


def _commit(controller: StageController) -> None:
    """Finalize a decided stage as the operator would (without a sink); raise naming the cause if it failed."""
    payload = controller.event_payload()
    layout = controller.layout
    if payload["status"] != TriggerStatus.SUCCESS:
        record_task_state(layout, TaskState.FAILED, reason=payload["reason"])
        raise RuntimeError(f"stage {controller.plan['stage']!r} failed: {payload['reason']}")
    commit_admitted(controller.plan, layout, payload, try_number=None, clear_number=None, by="runner")
    remove_losers(layout, controller.plan["parallelism"], admitted_of(payload))


def run_stage(plan: StagePlan, timeout: float = 1800.0, fresh: bool = False) -> StageController:
    """Write the plan, step a controller until the stage is decided, commit it; return the controller."""
    layout = StageLayout.of_plan(plan)
    own_run(layout)
    if fresh:
        wipe_stage_attempts(layout)
    layout.store.replace_json(layout.name(layout.plan), plan)
    journal.record_stage(layout, Event.PLAN_DECIDED, parallelism=plan["parallelism"],
                   decision=plan.get("parallelism_decision"))
    for warning in plan.get("warnings") or []:
        journal.record_stage(layout, Event.PLAN_WARNING, message=warning)
    controller = StageController.open(plan)
    deadline = time.monotonic() + timeout
    while not controller.done:
        if time.monotonic() > deadline:
            controller.kill_all("standalone run timed out")
            raise TimeoutError(f"stage {plan['stage']!r} did not finish within {timeout}s")
        controller.step()
        wait_for_next_step([controller])  # the controller's own cadence, as in the trigger
    _commit(controller)
    return controller
