"""The stale-event guard is kept under a triggerer and dropped only when the trigger runs in line (dag.test)."""

from __future__ import annotations

from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms, set_supervisor_comms

from airflow_provider_speculative.triggers.timing import MIN_SECONDS_BEFORE_EVENT, min_seconds_before_event


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
