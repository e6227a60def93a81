"""The stage task's own state in the store (``task.json``): what hybrid consumers of the stage go by."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.store.layout import StageLayout


def record_task_state(layout: StageLayout, state: TaskState, *, try_number: int | None = None,
                      clear_number: int | None = None, reason: str | None = None) -> None:
    """Record the stage task's state (``task.json``) for hybrid consumers: planning, deferred, failed, committed."""
    name = layout.name(task_state_path(layout))
    previous = layout.store.read_json(name) or {}
    layout.store.replace_json(name, {
        "state": str(state), "at": time.time(), "reason": reason,
        "try_number": try_number if try_number is not None else previous.get("try_number"),
        "clear_number": clear_number if clear_number is not None else previous.get("clear_number", 0)})


def task_state_path(layout: StageLayout) -> Path:
    """Where a stage's operator records its task's state (planning, deferred, failed, committed)."""
    return layout.task_state
