"""HybridInputsTrigger: wait (without a worker) for the plans of a hybrid consumer's producer stages.

Also, under ``dag.test()``, for the commits of a blocking consumer's producers: a stage scheduled with
``trigger_rule="always"`` (it starts in the triggerer in a real deployment) may run before them there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_speculative.core.hybrid import producer_commit_usable, producer_plan_usable
from airflow_provider_speculative.core.trigger_events import TaskEvent, TriggerStatus
from airflow_provider_speculative.settings import store_of
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import COMMITTED_FILE, PLAN_FILE, TASK_STATE_FILE
from airflow_provider_speculative.triggers.timing import min_seconds_before_event

POLL_SECONDS = 1.0


def _stage_documents(entry: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A producer stage's plan, task state and commit: by name in its store, or by path (older kwargs)."""
    if "name" not in entry:  # serialized by a version whose entries named only the stage directory
        stage_dir = Path(entry["dir"])
        return (read_json(stage_dir / PLAN_FILE), read_json(stage_dir / TASK_STATE_FILE),
                read_json(stage_dir / COMMITTED_FILE))
    store = store_of(entry["store"], entry.get("conn_id") or "")
    plan, task_state, committed = (store.read_json(f"{entry['name']}/{file}")
                                   for file in (PLAN_FILE, TASK_STATE_FILE, COMMITTED_FILE))
    return plan, task_state, committed


class HybridInputsTrigger(BaseTrigger):
    """Fire ``ready`` once every producer has a usable plan, ``failed`` if one failed, ``waiting`` after ``window``."""

    def __init__(self, where: str, inputs: dict[str, dict[str, Any]], clear_number: int, deferred_at: float,
                 window: float) -> None:
        super().__init__()
        self.where = where
        # input name -> {"stage": producer stage, "store": its store root, "name": its stage's name there,
        # "conn_id": where the store's credentials are, "dir": its directory (what older versions read)}
        self.inputs = inputs
        self.clear_number = clear_number
        self.deferred_at = deferred_at
        self.window = window

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Everything is in the kwargs; the state is in the store."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"where": self.where, "inputs": self.inputs, "clear_number": self.clear_number,
                 "deferred_at": self.deferred_at, "window": self.window})

    def check(self) -> TaskEvent | None:
        """One look at the producers' stage directories: an event payload, or None to keep waiting."""
        waiting = []
        for name, entry in self.inputs.items():
            plan, task_state, committed = _stage_documents(entry)
            usable, failure = producer_plan_usable(plan, task_state, committed, self.clear_number)
            if entry.get("need") == "commit":  # a blocking producer: its commit, not its plan
                usable = producer_commit_usable(committed, self.clear_number)
            if failure:
                kind = "producer" if entry.get("need") == "commit" else "hybrid producer"
                return TaskEvent(status=TriggerStatus.FAILED,
                                 reason=f"{self.where}, input {name!r}: {kind} stage {entry['stage']!r} {failure}")
            if not usable:
                waiting.append(name)
        return None if waiting else TaskEvent(status=TriggerStatus.READY)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll the store every second; fire when ready, failed, or the window is over (the task reschedules)."""
        guard = min_seconds_before_event()
        while True:
            payload = await asyncio.to_thread(self.check)
            elapsed = time.time() - self.deferred_at
            if payload is None and elapsed >= self.window:
                payload = TaskEvent(status=TriggerStatus.WAITING)
            if payload is not None and elapsed >= guard:
                break
            await asyncio.sleep(POLL_SECONDS)
        yield TriggerEvent(payload)
