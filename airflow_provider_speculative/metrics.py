"""The one metrics emitter: FLIP-168's gauges per stage through Airflow's Stats (StatsD or OpenTelemetry)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_speculative.core.plan import StagePlan

# FLIP-168's two metrics, named as Flink names them.
GAUGES = ("numSlowExecutionVertices", "numEffectiveSpeculativeExecutions")


class StageMetrics:
    """Gauges of one stage run, named ``speculative.<dag_id>.<task_id>.<metric>`` and tagged dag_id/stage/task_id.

    Named by task id, not stage name: two pipelines compiled as TaskGroups may both have a stage ``scan``
    (task ids ``east.scan`` and ``west.scan``), and their gauges must not overwrite each other.
    """

    def __init__(self, dag_id: str, stage: str, task_id: str | None = None) -> None:
        task = task_id or stage
        self.tags = {"dag_id": dag_id, "stage": stage, "task_id": task}
        self.prefix = f"speculative.{dag_id}.{task}"
        self.last: dict[str, Any] = {}

    @classmethod
    def for_plan(cls, plan: StagePlan) -> StageMetrics:
        """The emitter of the stage run a plan describes."""
        return cls(plan["dag_id"], plan["stage"], plan.get("task_id"))

    def emit(self, summary: Mapping[str, Any], *, only_changed: bool = True) -> None:
        """Send the gauges found in ``summary`` (by default only those that changed since the last call)."""
        from airflow.sdk.observability.stats import Stats

        for name in GAUGES:
            value = summary.get(name)
            if value is None or (only_changed and self.last.get(name) == value):
                continue
            Stats.gauge(f"{self.prefix}.{name}", value, tags=self.tags)
            self.last[name] = value
