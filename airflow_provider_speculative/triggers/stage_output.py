"""StageOutputTrigger: poll the store for a stage's commit, holding no worker slot. Thin: see control/stage_output."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_speculative.control.stage_output import StageOutputLocator
from airflow_provider_speculative.core.trigger_events import OutputEvent, TriggerStatus


class StageOutputTrigger(BaseTrigger):
    """Fire ``success`` once the stage run's output is committed, or ``timeout`` naming what is missing.

    Reads only the store (by name, through a thread: a POSIX directory or an S3 prefix); never the metadata database.
    """

    def __init__(self, store_root: str, dag_id: str, stage: str, *, logical_date: str | None = None,
                 run_id: str | None = None, subtasks: list[int] | None = None,
                 subpartitions: list[int] | None = None, poke_interval: float = 30.0,
                 deadline: float | None = None, conn_id: str = "") -> None:
        super().__init__()
        # ``store_root``: a POSIX path or an ``s3://`` URL; ``conn_id`` names the connection of its credentials
        # (``[speculative] s3_conn_id``), resolved by the triggerer: no credential is ever serialized.
        self.store_root, self.dag_id, self.stage = store_root, dag_id, stage
        self.conn_id = conn_id
        self.logical_date, self.run_id = logical_date, run_id
        self.subtasks, self.subpartitions = subtasks, subpartitions
        self.poke_interval, self.deadline = poke_interval, deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Everything needed to rebuild the locator in any triggerer."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"store_root": self.store_root, "dag_id": self.dag_id, "stage": self.stage,
                 "logical_date": self.logical_date, "run_id": self.run_id, "subtasks": self.subtasks,
                 "subpartitions": self.subpartitions, "poke_interval": self.poke_interval,
                 "deadline": self.deadline, "conn_id": self.conn_id})

    def locator(self) -> StageOutputLocator:
        """The store watcher this trigger polls."""
        return StageOutputLocator(self.store_root, self.dag_id, self.stage, logical_date=self.logical_date,
                                  run_id=self.run_id, subtasks=self.subtasks, subpartitions=self.subpartitions,
                                  conn_id=self.conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll every ``poke_interval`` seconds; yield exactly one event."""
        locator = self.locator()
        while True:
            try:
                observation = await asyncio.to_thread(locator.check)
            except Exception as exc:  # a broken store must fail the sensor with its cause, not kill the trigger
                yield TriggerEvent(OutputEvent(status=TriggerStatus.ERROR, message=f"{type(exc).__name__}: {exc}"))
                return
            if observation.ready:
                yield TriggerEvent({"status": TriggerStatus.SUCCESS, **observation.payload()})
                return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent({"status": TriggerStatus.TIMEOUT, **observation.payload()})
                return
            wait = self.poke_interval
            if self.deadline is not None:
                wait = max(0.0, min(wait, self.deadline - time.time()))
            self.log.debug("%s", observation.message)
            await asyncio.sleep(wait)
