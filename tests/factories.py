"""Shared test builders: a fake clock, a stage's plan.json record, a plan from ``plan_stage``, a task instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout


class Clock:
    """A fake clock the test advances by setting ``now``; pass it wherever a ``() -> float`` clock goes."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# Two targets with room for every attempt a unit test launches: placement is not what most tests check.
TARGETS = ({"name": "local-a", "slots": 4}, {"name": "local-b", "slots": 4})


def stage_plan(root: Path | str = "/store", *, dag_id: str = "d", run_id: str = "r", stage: str = "scan",
               parallelism: int = 2, config: dict[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    """A stage's plan.json record with the keys the controller and the readers use.

    ``config`` holds ``[speculative]`` overrides on top of :data:`TARGETS`; the plan names each configured
    target with a ``fake`` backend. ``keys`` add plan keys or replace any built here.
    """
    cfg = SpeculativeConfig().with_overrides({"targets": list(TARGETS), **(config or {})}, "test")
    plan = {"store_root": str(root), "dag_id": dag_id, "run_id": run_id, "stage": stage, "parallelism": parallelism,
            "upstreams": [], "consumers": [], "inputs": {},
            "subtasks": [{"inputs": {}, "input_bytes": 0} for _ in range(parallelism)],
            "config": cfg.to_json(),
            "targets": {t.name: {"kind": "fake", "command": ["app.py"], "env": {}} for t in cfg.targets}}
    return {**plan, **keys}


def write_plan(plan: dict[str, Any]) -> StageLayout:
    """Write ``plan`` as its stage's plan.json in the store it names; return the stage's layout."""
    layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
    layout.claim_run()  # as planning does before its first write: the run's removals are owned deletes
    atomic_write_json(layout.plan, plan)
    return layout


# The planning context plan_stage gets from control/planning.py, for a DAG run "d"/"r" with no targets.
PLAN_CONTEXT: dict[str, Any] = {"dag_id": "d", "run_id": "r", "logical_date": None, "store_root": "/store",
                                "application": "/a.py", "targets": {}}


def planned(graph: PipelineGraph, stage: str, config: SpeculativeConfig | None = None, *,
            sources: dict[str, list[tuple[str, int]]] | None = None,
            upstream: dict[str, dict[str, Any]] | None = None, **context: Any) -> dict[str, Any]:
    """``plan_stage`` for one stage without sink or speculation blocker; ``context`` replaces context keys."""
    return plan_stage(graph, stage, config or SpeculativeConfig(), source_files=sources or {},
                      upstream_committed=upstream or {}, sink=None, speculation_blocker=None,
                      context={**PLAN_CONTEXT, **context})


class FakeTI:
    """The task instance an operator finds in a unit test's context: try number, task id and the XComs pushed."""

    def __init__(self, try_number: int = 1, task_id: str = "t") -> None:
        self.try_number = try_number
        self.task_id = task_id
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        """Keep ``value`` under ``key``, as Airflow's ``ti.xcom_push`` stores it."""
        self.xcoms[key] = value
