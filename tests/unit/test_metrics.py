"""Stage gauges: named by task id, so grouped pipelines' stages of one name report apart."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_speculative.metrics import StageMetrics


def test_grouped_stages_of_the_same_name_emit_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.observability.stats import Stats

    sent: list[tuple[str, Any, dict[str, str]]] = []
    monkeypatch.setattr(Stats, "gauge", lambda name, value, tags=None: sent.append((name, value, tags)))
    for task_id in ("east.scan", "west.scan"):
        plan: Any = {"dag_id": "d", "stage": "scan", "task_id": task_id}
        StageMetrics.for_plan(plan).emit({"numSlowExecutionVertices": 1})
    assert [name for name, _, _ in sent] == ["speculative.d.east.scan.numSlowExecutionVertices",
                                             "speculative.d.west.scan.numSlowExecutionVertices"]
    assert sent[0][2] == {"dag_id": "d", "stage": "scan", "task_id": "east.scan"}
    StageMetrics.for_plan({"dag_id": "d", "stage": "agg"}).emit({"numSlowExecutionVertices": 0})  # type: ignore[typeddict-item]
    assert sent[-1][0] == "speculative.d.agg.numSlowExecutionVertices"
