"""When a trigger may fire (the guard against Airflow's stale-event race after a deferral) and when it steps next."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_speculative.control.controller import StageController

# Under a real executor, a trigger that fires within ~5 s of defer() can get the resumed task failed:
# the scheduler may process the executor's stale "success" of the deferring run after the trigger
# event and call it a state mismatch (apache/airflow#23824, #66374, #71580, #72716; the last two are
# open on 3.3). So the event of a trigger is never sent earlier than this after deferral.
MIN_SECONDS_BEFORE_EVENT = 6.0


def runs_in_line() -> bool:
    """True when the trigger runs inside the task's own process under ``dag.test()``.

    Then there is no executor and no stale event, so the guard only costs time: ``dag.test()`` sets
    the Task SDK's supervisor comms to its in-process kind, a triggerer sets its own.
    """
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms
    except ImportError:  # an Airflow without these internals: keep the guard
        return False
    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms)


def min_seconds_before_event() -> float:
    """The guard in seconds: :data:`MIN_SECONDS_BEFORE_EVENT` in a triggerer, 0 in line under ``dag.test()``."""
    return 0.0 if runs_in_line() else MIN_SECONDS_BEFORE_EVENT


async def await_next_step(controller: StageController) -> None:
    """control.controller.wait_for_next_step for one controller, without blocking the triggerer's loop.

    Not that function run in a thread: a triggerer's small thread pool would be held by every waiting
    stage. Only the notice check (one directory read) goes to a thread.
    """
    interval = controller.config.check_interval
    started = time.monotonic()
    await asyncio.sleep(controller.wake_after())
    while (left := interval - (time.monotonic() - started)) > 0:
        if await asyncio.to_thread(controller.changed):
            return
        # The store's own poll (StoreBackend.notice_poll_seconds): a look on S3 is a listing request.
        await asyncio.sleep(min(controller.notice_poll, left))
