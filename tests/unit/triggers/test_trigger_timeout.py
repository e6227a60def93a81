"""The controller trigger's view of Airflow's trigger timeout (``timeout_after``)."""

from __future__ import annotations

import asyncio
import datetime as dt

from airflow_provider_speculative.triggers.controller import StageControllerTrigger


def _trigger(deadline: dt.datetime | None) -> StageControllerTrigger:
    trigger = StageControllerTrigger(plan_path="/nowhere/plan.json", deferred_at=0.0)
    if deadline is not None:
        trigger.timeout_after = deadline
    return trigger


def test_no_timeout_never_times_out() -> None:
    assert not _trigger(None).timed_out()


def test_a_deadline_in_the_future_has_not_passed_and_one_in_the_past_has() -> None:
    now = dt.datetime.now(dt.UTC)
    assert not _trigger(now + dt.timedelta(minutes=5)).timed_out()
    assert _trigger(now - dt.timedelta(seconds=1)).timed_out()
    # Airflow's database may hand a naive UTC datetime.
    assert _trigger((now - dt.timedelta(seconds=1)).replace(tzinfo=None)).timed_out()
    assert not _trigger((now + dt.timedelta(minutes=5)).replace(tzinfo=None)).timed_out()


def test_cleanup_of_a_trigger_that_never_ran_does_nothing() -> None:
    # Cancelled before its controller existed (still planning): nothing to stop, nothing raised.
    asyncio.run(_trigger(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)).cleanup())
