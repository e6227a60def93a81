"""Finalize-on-master: commit exactly the admitted attempt of every subtask, then remove the losers' outputs.

Two callers share it. The stage operator's ``execute_complete`` (on a worker, after the controller's
event) commits stages that have a sink or asset outlets, because sinks finalize with the operator's
code and Airflow records asset events only for a task that succeeds on a worker. The controller
trigger commits the other stages itself and ends the task from the triggerer (``TaskSuccessEvent``):
no worker run and no scheduler round trip per stage. Both are idempotent: ``committed.json`` is
rewritten atomically with the same admitted attempts, so a commit repeated after a crash (the
triggerer's or the worker's) publishes the same result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.store.files import atomic_write_json, wait_for_file
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import admitted_results, remove_attempt_output, write_committed
from airflow_provider_speculative.store.task_state import record_task_state

SinkFinalizer = Callable[[dict[int, int], dict[str, Any]], dict[str, Any] | None]


def admitted_of(event: dict[str, Any]) -> dict[int, int]:
    """The controller event's admitted attempt per subtask."""
    return {int(k): int(v) for k, v in event["admitted"].items()}


def commit_admitted(plan: dict[str, Any], layout: StageLayout, event: dict[str, Any], *, try_number: int | None,
                    clear_number: int | None, finalize_sink: SinkFinalizer | None = None,
                    by: str = "worker") -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Publish ``committed.json`` for the admitted attempts (after the sink's global finalize, if any).

    Returns the committed record and the sink's result.
    """
    admitted = admitted_of(event)
    record = admitted_results(layout, admitted)
    journals.record(layout.journal, "finalize_started", admitted=event["admitted"], try_number=try_number, by=by)
    sink_result = finalize_sink(admitted, record) if finalize_sink is not None else None
    record.update(fingerprint=plan["fingerprint"], committed_at=time.time(), sink=sink_result,
                  summary=event.get("summary", {}))
    write_committed(layout, record)
    journals.record(layout.journal, "finalize_done", sink=sink_result, by=by)
    record_task_state(layout, "committed", try_number=try_number, clear_number=clear_number)
    return record, sink_result


def remove_losers(layout: StageLayout, parallelism: int,
                  admitted: dict[int, int]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """Delete the outputs of every attempt that is not admitted; (outputs removed, every losing attempt)."""
    removed = 0
    losers = []
    for subtask in range(parallelism):
        for number in layout.attempt_numbers(subtask):
            if admitted.get(subtask) != number:
                losers.append((subtask, number))
                removed += remove_attempt_output(layout, subtask, number)
    return removed, tuple(losers)


def commit_summary(stage: str, layout: StageLayout, sink_result: dict[str, Any] | None,
                   summary: dict[str, Any]) -> dict[str, Any]:
    """What the stage task returns (its XCom): where the commit is, the sink's result, the controller summary."""
    return {"stage": stage, "committed": str(layout.committed), "sink": sink_result, **summary}


def hold_after_commit(layout: StageLayout, timeout: float = 900.0) -> None:
    """Fault injection ``hold_commit``: record the hold, then wait (bounded) until a test releases it."""
    held, release = layout.commit_hold()
    atomic_write_json(held, {"pid": os.getpid(), "at": time.time()})
    wait_for_file(release, timeout, 0.1)
