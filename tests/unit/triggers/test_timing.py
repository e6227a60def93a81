"""When a trigger may fire (the stale-event guard, dropped only in line under dag.test) and when it steps next."""

from __future__ import annotations

import asyncio

import pytest
from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms, set_supervisor_comms

from airflow_provider_speculative.triggers.timing import (
    MIN_SECONDS_BEFORE_EVENT,
    await_next_step,
    min_seconds_before_event,
)


class TriggererComms:
    """Stands for the comms a triggerer process installs (anything but the in-process kind)."""


def test_in_line_under_dag_test_the_guard_is_zero() -> None:
    # What InProcessTestSupervisor.run_trigger_in_process installs around trigger.run() in dag.test().
    with set_supervisor_comms(InProcessSupervisorComms(supervisor=None)):
        assert min_seconds_before_event() == 0.0


def test_under_a_triggerer_or_outside_any_task_the_guard_is_kept() -> None:
    with set_supervisor_comms(TriggererComms()):
        assert min_seconds_before_event() == MIN_SECONDS_BEFORE_EVENT
    assert min_seconds_before_event() == MIN_SECONDS_BEFORE_EVENT
    assert MIN_SECONDS_BEFORE_EVENT >= 5.0  # the race window seen in apache/airflow#66374


class NoticeAfter:
    """A controller whose change notice appears at the ``n``-th look; its check_interval is an hour."""

    def __init__(self, n: int, notice_poll: float = 0.1) -> None:
        self.config = type("Config", (), {"check_interval": 3600.0})()
        self.looks, self.n, self.notice_poll = 0, n, notice_poll

    def wake_after(self) -> float:
        return 0.0

    def changed(self) -> bool:
        self.looks += 1
        return self.looks >= self.n


def test_a_change_notice_ends_the_triggers_wait_before_the_check_interval() -> None:
    controller = NoticeAfter(3)
    asyncio.run(await_next_step(controller))  # type: ignore[arg-type]  # returns at the notice, not in an hour
    assert controller.looks == 3


@pytest.mark.parametrize("poll", [0.1, 1.0])
def test_the_trigger_looks_for_a_notice_as_often_as_the_store_says(poll: float,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    controller = NoticeAfter(4, notice_poll=poll)
    asyncio.run(await_next_step(controller))  # type: ignore[arg-type]
    assert controller.looks == 4 and slept == [0.0, poll, poll, poll]
