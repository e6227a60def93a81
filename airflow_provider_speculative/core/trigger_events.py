"""What this provider's triggers yield and its operator and sensor read: the statuses and the payloads.

A payload crosses the triggerer, the metadata database and a worker that may run another provider
version, so the values of :class:`TriggerStatus` and the payloads' keys never change; a reader checks
an event before trusting it (operators/stage.py ``_event_plan``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NotRequired, TypedDict

from airflow_provider_speculative.core.summary import StageSummary


class TriggerStatus(StrEnum):
    """The ``status`` of a trigger event; the task method the trigger resumes dispatches on it."""

    # StageControllerTrigger: the stage run is decided; a worker's execute_complete commits or fails it.
    SUCCESS = "success"
    FAILED = "failed"
    # StageControllerTrigger after committing in the triggerer: a worker records the asset events.
    COMMITTED = "committed"
    # StageControllerTrigger: the commit in the triggerer raised; the worker fails the task with the cause.
    COMMIT_FAILED = "commit_failed"
    # StageControllerTrigger: the task's execution_timeout passed; its attempts were stopped.
    TIMED_OUT = "timed_out"
    # StageStartTrigger, before there is a controller.
    PLAN_FAILED = "plan_failed"
    UPSTREAM_FAILED = "upstream_failed"
    UPSTREAM_SKIPPED = "upstream_skipped"
    # HybridInputsTrigger: every producer is usable (READY), one failed (FAILED), or the window is over.
    READY = "ready"
    WAITING = "waiting"
    # StageOutputTrigger: the committed output is there (SUCCESS), the deadline passed, or the store failed.
    TIMEOUT = "timeout"
    ERROR = "error"


# The statuses of a decided stage run: the only ones execute_complete accepts. A tuple: a malformed
# event's status may be any JSON value, and tuple membership never hashes it.
DECIDED: tuple[TriggerStatus, ...] = (TriggerStatus.SUCCESS, TriggerStatus.FAILED)


class ControllerEvent(TypedDict):
    """The one event of a decided stage run: everything finalize needs (``dag.test()`` drops defer kwargs)."""

    status: TriggerStatus
    plan_path: str
    # The stage summary at the decision (control/summary.py), recorded by finalize.
    summary: StageSummary
    # SUCCESS: the admitted attempt per subtask, keys as strings (the payload is JSON).
    admitted: NotRequired[dict[str, int]]
    # FAILED: why, failure counts by cause, the first causes in full and where their logs are.
    reason: NotRequired[str]
    causes: NotRequired[list[str]]
    failed_attempts: NotRequired[int]
    counts_by_cause: NotRequired[dict[str, int]]
    failed_keys: NotRequired[list[list[int]]]


class TaskEvent(TypedDict):
    """Any other event of a stage's triggers: its status and what the resumed task method needs."""

    status: TriggerStatus
    # FAILED (a hybrid producer), PLAN_FAILED, UPSTREAM_*, COMMIT_FAILED, TIMED_OUT: the message the task fails with.
    reason: NotRequired[str]
    # PLAN_FAILED: the exception's class name.
    error: NotRequired[str]
    # COMMITTED: the stage run's plan and the commit's summary (the task's XCom).
    plan_path: NotRequired[str]
    result: NotRequired[dict[str, Any]]


class OutputEvent(TypedDict):
    """StageOutputTrigger's event: SUCCESS, TIMEOUT (with what it saw last) or ERROR (with the cause)."""

    status: TriggerStatus
    message: str
    run_id: NotRequired[str | None]
    committed: NotRequired[str | None]
    ready: NotRequired[bool]
