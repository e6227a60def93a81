"""What an asset event says about a stage's commit, and which task try it records (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_speculative.core.plan import StagePlan

# The extra field that names the task try an event records (the REST API has no idempotency key).
KEY_FIELD = "speculative_commit"


def asset_event_extra(plan: StagePlan, record: dict[str, Any], summary: Mapping[str, Any],
                      sink_result: dict[str, Any] | None) -> dict[str, Any]:
    """What a consumer needs to know about one commit without reading the store (JSON values only)."""
    subtasks = record.get("subtasks") or {}
    result = sink_result or {}
    # The attempts' manifests count records; a sink's own count is the fallback (it may not count them).
    counts = [e.get("records") for e in subtasks.values()]
    records = sum(int(c) for c in counts) if counts and None not in counts else result.get("records")
    files = result.get("files")
    if not isinstance(files, int):
        files = sum(len(e.get("files") or ()) or int(e.get("file_count") or 0) for e in subtasks.values())
    return {"dag_id": plan["dag_id"], "run_id": plan["run_id"], "stage": plan["stage"],
            "logical_date": plan.get("logical_date"), "records": records, "files": files,
            "location": result.get("path") or result.get("table"),
            "attempts_admitted": {k: e.get("attempt") for k, e in sorted(subtasks.items(), key=lambda i: int(i[0]))},
            "numEffectiveSpeculativeExecutions": summary.get("numEffectiveSpeculativeExecutions"),
            "numSlowExecutionVertices": summary.get("numSlowExecutionVertices")}


def commit_key(dag_id: str, run_id: str, stage: str, try_number: int) -> str:
    """Which task try's commit an event records (one event per asset and key)."""
    return f"{dag_id}/{run_id}/{stage}/try-{try_number}"
