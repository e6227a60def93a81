"""FLIP-168 attempt states: current-attempt priority and execution time."""

from __future__ import annotations

import itertools

import pytest

from airflow_provider_speculative.core.states import (
    STATE_PRIORITY,
    Attempt,
    AttemptState,
    current_attempt,
    state_rank,
)

S = AttemptState
EXPECTED_PRIORITY = [S.FINISHED, S.RUNNING, S.INITIALIZING, S.DEPLOYING, S.SCHEDULED, S.CREATED,
                     S.CANCELING, S.FAILED, S.CANCELED]


def attempt(number: int, state: AttemptState, **kw) -> Attempt:
    return Attempt(subtask=0, number=number, target="t", state=state, **kw)


def test_priority_order_is_flip168() -> None:
    assert list(STATE_PRIORITY) == EXPECTED_PRIORITY
    assert [state_rank(s) for s in EXPECTED_PRIORITY] == list(range(len(EXPECTED_PRIORITY)))


@pytest.mark.parametrize(("higher", "lower"), list(itertools.combinations(EXPECTED_PRIORITY, 2)))
def test_current_attempt_prefers_higher_priority_state(higher: AttemptState, lower: AttemptState) -> None:
    # The lower-priority attempt has the lower number, so only the state can make the higher one win.
    attempts = [attempt(0, lower), attempt(1, higher)]
    assert current_attempt(attempts) is attempts[1]
    assert current_attempt(list(reversed(attempts))) is attempts[1]


@pytest.mark.parametrize("state", EXPECTED_PRIORITY)
def test_current_attempt_tie_goes_to_lowest_attempt_number(state: AttemptState) -> None:
    attempts = [attempt(2, state), attempt(0, state), attempt(1, state)]
    assert current_attempt(attempts).number == 0


def test_current_attempt_of_no_attempts_is_none() -> None:
    assert current_attempt([]) is None


def test_live_and_possible_to_finish() -> None:
    live = {s for s in S if attempt(0, s).live}
    possible = {s for s in S if attempt(0, s).possible_to_finish}
    assert live == {S.CREATED, S.SCHEDULED, S.DEPLOYING, S.INITIALIZING, S.RUNNING, S.CANCELING}
    assert possible == {S.CREATED, S.SCHEDULED, S.DEPLOYING, S.INITIALIZING, S.RUNNING, S.FINISHED}


@pytest.mark.parametrize("state", [S.DEPLOYING, S.INITIALIZING, S.RUNNING])
def test_execution_time_of_executing_attempt_counts_from_deploying_to_now(state: AttemptState) -> None:
    a = attempt(0, state, created_at=0.0, deploying_at=10.0)
    assert a.execution_time(now=25.0) == 15.0


def test_execution_time_of_finished_attempt_uses_end_not_now() -> None:
    a = attempt(0, S.FINISHED, created_at=0.0, deploying_at=10.0, end_at=30.0)
    assert a.execution_time(now=1000.0) == 20.0


def test_execution_time_is_zero_before_deploying() -> None:
    assert attempt(0, S.CREATED, created_at=0.0).execution_time(now=100.0) == 0.0
    assert attempt(0, S.SCHEDULED, created_at=0.0).execution_time(now=100.0) == 0.0
    assert attempt(0, S.RUNNING, created_at=0.0).execution_time(now=100.0) == 0.0  # no DEPLOYING timestamp


@pytest.mark.parametrize("state", [S.CANCELING, S.FAILED, S.CANCELED])
def test_execution_time_is_zero_for_attempts_that_will_not_finish(state: AttemptState) -> None:
    assert attempt(0, state, deploying_at=10.0, end_at=20.0).execution_time(now=100.0) == 0.0


def test_execution_time_is_never_negative() -> None:
    assert attempt(0, S.RUNNING, deploying_at=50.0).execution_time(now=40.0) == 0.0
    assert attempt(0, S.FINISHED, deploying_at=50.0, end_at=40.0).execution_time(now=60.0) == 0.0
