"""Finalize-on-master: commit exactly the admitted attempt of every subtask, then remove the losers' outputs.

Two callers share it. By default the controller trigger commits a stage (its sink too) and ends the
task from the triggerer: no worker run and no scheduler round trip per stage; a stage with asset
outlets then resumes on a worker only to publish the asset event (Airflow records asset events only
for a task that succeeds on a worker). With ``commit_in_triggerer=False`` (and under ``dag.test()``)
the stage operator's ``execute_complete`` commits on a worker after the controller's event. Both are
idempotent: ``committed.json`` is rewritten atomically with the same admitted attempts, so a commit
repeated after a crash (the triggerer's or the worker's) publishes the same result.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.plan import StagePlan
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.core.trigger_events import ControllerEvent
from airflow_provider_speculative.sinks.base import AttemptResult, FinalizationContext, Sink, StagingScope
from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import admitted_results, discard_attempt_output, write_committed
from airflow_provider_speculative.store.task_state import record_task_state

SinkFinalizer = Callable[[dict[int, int], dict[str, Any]], dict[str, Any] | None]

log = logging.getLogger(__name__)


def sink_finalizer(plan: StagePlan, layout: StageLayout) -> SinkFinalizer | None:
    """The plan's sink's global finalize over the admitted attempts (None for a stage without a sink)."""
    if not plan["output"].get("sink"):
        return None

    def finalize_sink(admitted: dict[int, int], record: dict[str, Any]) -> dict[str, Any] | None:
        sink = Sink.from_json(plan["output"]["sink"])
        ctx = FinalizationContext(
            parallelism=plan["parallelism"], dag_id=plan["dag_id"], run_id=plan["run_id"], stage=layout.stage,
            logical_date=plan.get("logical_date"), store=layout.store,
            # An object-store sink opens its own backend: with the plan's S3 connection, read only if it asks.
            extra={"pipeline": plan.get("pipeline"), "s3_credentials": lambda: _s3_credentials(plan)},
            attempts={s: AttemptResult(subtask=s, attempt=a, data_dir=layout.data(s, a),
                                       files=record["subtasks"][str(s)]["files"],
                                       records=record["subtasks"][str(s)]["records"],
                                       sink_info=record["subtasks"][str(s)]["sink"],
                                       data_name=layout.name(layout.data(s, a)))
                      for s, a in admitted.items()})
        return sink.finalize_global(ctx)

    return finalize_sink


def _s3_credentials(plan: StagePlan) -> Any:
    """The plan's ``[speculative] s3_conn_id`` (or the AWS environment) as S3 credentials for a sink."""
    from airflow_provider_speculative.hooks.objectstore import s3_settings

    where = f"pipeline {plan.get('pipeline')!r}, stage {plan['stage']!r}"
    return s3_settings(str((plan.get("config") or {}).get("s3_conn_id") or ""), where)


def cleanup_sink_staging(plan: StagePlan, layout: StageLayout, attempts: tuple[tuple[int, int], ...] | None,
                         logger: Any = None) -> None:
    """Let the sink remove what attempts staged outside the store (all of a failed run, or the losers)."""
    if not (plan.get("output") or {}).get("sink"):
        return
    scope = StagingScope(plan["dag_id"], plan["run_id"], layout.stage, attempts)
    try:
        removed = Sink.from_json(plan["output"]["sink"]).cleanup_staging(scope)
    except Exception as exc:  # clean-up must not hide the stage's own outcome; gc finds what is left
        (logger or log).warning("stage %s: sink staging clean-up failed (airflow speculative gc will retry): %s",
                                plan["stage"], exc)
        journals.record_stage(layout, Event.SINK_STAGING_CLEANUP_FAILED, error=f"{type(exc).__name__}: {exc}")
        return
    if removed:
        journals.record_stage(layout, Event.SINK_STAGING_REMOVED, objects=removed,
                              scope="stage run" if attempts is None else "losers")


def admitted_of(event: ControllerEvent) -> dict[int, int]:
    """The controller event's admitted attempt per subtask."""
    return {int(k): int(v) for k, v in event["admitted"].items()}


def commit_admitted(plan: StagePlan, layout: StageLayout, event: ControllerEvent, *, try_number: int | None,
                    clear_number: int | None, finalize_sink: SinkFinalizer | None = None,
                    by: str = "worker") -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Publish ``committed.json`` for the admitted attempts (after the sink's global finalize, if any).

    Returns the committed record and the sink's result.
    """
    admitted = admitted_of(event)
    record = admitted_results(layout, admitted)
    journals.record_stage(layout, Event.FINALIZE_STARTED, admitted=event["admitted"], try_number=try_number, by=by)
    sink_result = finalize_sink(admitted, record) if finalize_sink is not None else None
    # try and clear number: a consumer waiting in the triggerer takes a commit of this clear of the DAG run.
    record.update(fingerprint=plan["fingerprint"], committed_at=time.time(), sink=sink_result,
                  summary=event.get("summary", {}), try_number=try_number, clear_number=clear_number)
    write_committed(layout, record)
    journals.record_stage(layout, Event.FINALIZE_DONE, sink=sink_result, by=by)
    record_task_state(layout, TaskState.COMMITTED, try_number=try_number, clear_number=clear_number)
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
                removed += discard_attempt_output(layout, subtask, number)
    return removed, tuple(losers)


def commit_summary(stage: str, layout: StageLayout, sink_result: dict[str, Any] | None,
                   summary: Mapping[str, Any]) -> dict[str, Any]:
    """What the stage task returns (its XCom): where the commit is, the sink's result, the controller summary."""
    return {"stage": stage, "committed": str(layout.committed), "sink": sink_result, **summary}


def hold_after_commit(layout: StageLayout, timeout: float = 900.0) -> None:
    """Fault injection ``hold_commit`` (core/faults.py): record the hold, wait (bounded) until a test releases it."""
    held, release = layout.commit_hold()
    layout.replace_json(held, {"pid": os.getpid(), "at": time.time()})
    layout.wait_for(release, timeout, 0.1)
