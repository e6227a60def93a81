"""StageScheduler driven with a fake clock (plain floats) and fake attempt observations."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.messages import (
    Action,
    AdmissionLost,
    Admit,
    BlockNode,
    Cancel,
    CompleteStage,
    Discard,
    FailStage,
    Launch,
)
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import Attempt, AttemptState
from tests.unit.core.scheduler_helpers import restore, step

S = AttemptState
SPECULATIVE = {"enabled": True, "baseline_lower_bound": 0.0}  # baseline = 1.5 x median, no 60 s floor


# -- helpers ------------------------------------------------------------------------------------


def targets(*specs: tuple[str, int] | tuple[str, int, str]) -> tuple[Target, ...]:
    return tuple(Target(name=spec[0], slots=spec[1], node=spec[2] if len(spec) > 2 else None) for spec in specs)


def scheduler(parallelism: int, **config) -> StageScheduler:
    extra = {k: config.pop(k) for k in ("speculation_blocker", "reused", "input_bytes") if k in config}
    return StageScheduler(parallelism=parallelism, config=SpeculativeConfig(**config), **extra)


def seen(sched: StageScheduler, subtask: int, number: int, state: AttemptState, **changes) -> Attempt:
    """What the controller would report for an attempt the scheduler knows about."""
    return replace(sched.attempts[subtask][number], state=state, **changes)


def running(sched: StageScheduler, subtask: int, number: int = 0, at: float = 0.0) -> Attempt:
    return seen(sched, subtask, number, S.RUNNING, deploying_at=at)


def finished(sched: StageScheduler, subtask: int, number: int = 0, end: float = 10.0) -> Attempt:
    known = sched.attempts[subtask][number]
    return seen(sched, subtask, number, S.FINISHED, end_at=end,
                deploying_at=known.deploying_at if known.deploying_at is not None else 0.0)


def failed(sched: StageScheduler, subtask: int, number: int = 0, end: float = 10.0, cause: str = "boom") -> Attempt:
    return seen(sched, subtask, number, S.FAILED, end_at=end, exit_code=1, cause=cause)


def of(actions: list[Action], kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def launched(actions: list[Action]) -> list[tuple[int, int, str]]:
    return [(a.subtask, a.attempt, a.target) for a in of(actions, Launch)]


def live_count(sched: StageScheduler, subtask: int) -> int:
    return sum(a.live for a in sched.attempts[subtask].values())


def start_all(sched: StageScheduler, now: float, deploy: float = 0.0) -> list[Action]:
    """Report every CREATED attempt as RUNNING since ``deploy``."""
    return step(sched, now, [running(sched, a.subtask, a.number, deploy)
                            for a in sched.all_attempts() if a.state == S.CREATED])


def straggler(**config) -> StageScheduler:
    """4 subtasks on local-a/local-b (2 slots each); 0, 1 and 2 finish after 10 s, 3 keeps running.

    With the default ratio 0.75 and multiplier 1.5 the baseline is 15 s, so subtask 3 (on local-b,
    deploying at 0) becomes slow at t=15.
    """
    sched = scheduler(4, **config)
    step(sched, 0.0)
    start_all(sched, 1.0)
    step(sched, 10.0, [finished(sched, s, end=10.0) for s in (0, 1, 2)])
    return sched


# -- placement ----------------------------------------------------------------------------------


def test_copies_of_a_scheduler_never_share_its_state_or_bookkeeping() -> None:
    def snapshot(s: StageScheduler) -> tuple[object, ...]:
        return (sorted((a.subtask, a.number) for a in s.all_attempts()), dict(s.admitted), set(s._book.dirty),
                sorted(s._queue.wanting))

    sched = scheduler(3, targets=targets(("local-a", 1)))
    step(sched, 0.0)  # subtask 0 launched; 1 and 2 wait for the slot
    before = snapshot(sched)
    assert before[0] == [(0, 0)]
    # dataclasses.replace would hand the copy this scheduler's _book, _queue and state dicts: refused, before
    # anything of the shared bookkeeping is touched.
    with pytest.raises(TypeError, match="bookkeeping belongs to another scheduler"):
        replace(sched, label="copy")
    with pytest.raises(TypeError, match="shallow copy"):
        copy.copy(sched)
    assert snapshot(sched) == before
    # A deep copy is a scheduler of its own: stepping it leaves the original as it was.
    clone = copy.deepcopy(sched)
    assert clone._book is not sched._book and clone._queue is not sched._queue and clone._caches is not sched._caches
    actions = step(clone, 1.0, [finished(clone, 0, end=1.0)])
    assert clone.admitted == {0: 0} and launched(actions) == [(1, 0, "local-a")]
    assert snapshot(sched) == before
    actions = step(sched, 2.0, [finished(sched, 0, end=2.0)])
    assert sched.admitted == {0: 0} and launched(actions) == [(1, 0, "local-a")]


def test_initial_launches_fill_target_slots_in_subtask_order() -> None:
    sched = scheduler(6)  # default: local-a and local-b with 2 slots each
    actions = step(sched, 0.0)
    assert launched(actions) == [(0, 0, "local-a"), (1, 0, "local-b"), (2, 0, "local-a"), (3, 0, "local-b")]
    assert all(not a.speculative and a.reason == "initial attempt" for a in of(actions, Launch))
    assert sched.attempts[0][0].state == S.CREATED and sched.attempts[0][0].created_at == 0.0


def test_no_over_subscription_while_slots_are_full() -> None:
    sched = scheduler(6)
    step(sched, 0.0)
    assert of(start_all(sched, 1.0), Launch) == []
    for now in (2.0, 50.0, 500.0):
        assert of(step(sched, now), Launch) == []
    assert sched.attempts[4] == {} and sched.attempts[5] == {}


def test_finishing_frees_a_slot_and_the_next_subtask_launches() -> None:
    sched = scheduler(6)
    step(sched, 0.0)
    start_all(sched, 1.0)
    actions = step(sched, 5.0, [finished(sched, 1, end=4.0)])  # subtask 1 ran on local-b
    assert of(actions, Admit) == [Admit(1, 0)]
    assert launched(actions) == [(4, 0, "local-b")]
    actions = step(sched, 6.0, [failed(sched, 0, end=6.0)])  # a failure frees a slot too (and restarts 0 first)
    assert launched(actions) == [(0, 1, "local-a")]


def test_every_node_blocked_still_runs_original_attempts() -> None:
    sched = scheduler(2)
    restore(sched, [], {}, {"local-a": 100.0, "local-b": 100.0})
    assert launched(step(sched, 0.0)) == [(0, 0, "local-a"), (1, 0, "local-b")]


def test_original_attempts_avoid_a_blocked_node_while_another_is_free() -> None:
    sched = scheduler(4)
    restore(sched, [], {}, {"local-b": 100.0})
    assert launched(step(sched, 0.0)) == [(0, 0, "local-a"), (1, 0, "local-a")]


# -- admission, cancel, discard, completion -------------------------------------------------------


def two_attempts(**config) -> StageScheduler:
    """One subtask with attempts 0 (local-a) and 1 (local-b) running, as after a speculative launch."""
    sched = scheduler(1, **config)
    restore(sched, [Attempt(0, 0, "local-a", S.RUNNING, deploying_at=0.0),
                   Attempt(0, 1, "local-b", S.RUNNING, speculative=True, deploying_at=5.0)], {}, {})
    return sched


def test_first_finisher_is_admitted_and_siblings_cancelled() -> None:
    sched = two_attempts()
    actions = step(sched, 20.0, [finished(sched, 0, 1, end=19.0)])
    assert of(actions, Admit) == [Admit(0, 1)]
    assert [(c.subtask, c.attempt) for c in of(actions, Cancel)] == [(0, 0)]
    assert sched.attempts[0][0].state == S.CANCELING
    assert sched.admitted == {0: 1}


def test_attempt_finishing_after_admission_is_discarded() -> None:
    sched = two_attempts()
    step(sched, 20.0, [finished(sched, 0, 1, end=19.0)])
    actions = step(sched, 21.0, [finished(sched, 0, 0, end=20.5)])
    assert [(d.subtask, d.attempt) for d in of(actions, Discard)] == [(0, 0)]
    assert of(actions, Admit) == []
    assert sched.admitted == {0: 1}


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_same_poll_finishers_earliest_end_wins(order: tuple[int, int]) -> None:
    sched = two_attempts()
    ends = {0: 19.0, 1: 17.0}
    actions = step(sched, 20.0, [finished(sched, 0, n, end=ends[n]) for n in order])
    assert of(actions, Admit) == [Admit(0, 1)]
    assert [(d.subtask, d.attempt) for d in of(actions, Discard)] == [(0, 0)]
    assert of(actions, Cancel) == []


def test_stage_complete_only_after_cancelled_losers_stop_and_only_once() -> None:
    sched = two_attempts()
    actions = step(sched, 20.0, [finished(sched, 0, 1, end=19.0)])
    assert of(actions, CompleteStage) == []
    # The loser is still alive (the backend reports it RUNNING): it stays CANCELING, no completion.
    actions = step(sched, 21.0, [running(sched, 0, 0)])
    assert sched.attempts[0][0].state == S.CANCELING
    assert of(actions, CompleteStage) == []
    actions = step(sched, 22.0, [seen(sched, 0, 0, S.CANCELED, end_at=22.0)])
    assert actions == [CompleteStage(admitted={0: 1})]
    assert sched.completed
    assert step(sched, 23.0) == []
    assert step(sched, 24.0, [finished(sched, 0, 0, end=24.0)]) == []


def test_a_lost_admission_overtakes_the_cancel_of_the_winner_which_keeps_its_state() -> None:
    sched = two_attempts()
    actions = step(sched, 20.0, [finished(sched, 0, 0, end=19.0)])
    assert actions == [Admit(0, 0), Cancel(0, 1, "attempt 0 finished first")]
    # Another controller admitted attempt 1 (it finished before this controller's Admit).
    assert sched.handle(AdmissionLost(0, 0, 1)) == [Discard(0, 0, "attempt 1 was admitted by another controller")]
    assert sched.admitted == {0: 1}
    assert sched.revised(actions[1]) is None  # the queued cancel of the winner is never carried out
    assert sched.revised(actions[0]) == actions[0]
    assert sched.attempts[0][1].state == S.RUNNING  # as last observed, not CANCELING
    assert step(sched, 20.5) == []  # no rule cancels the admitted attempt while its end is not observed
    actions = step(sched, 21.0, [finished(sched, 0, 1, end=20.0)])
    assert actions == [CompleteStage(admitted={0: 1})]
    assert sched.attempts[0][1].state == S.FINISHED


def test_a_completion_decided_with_a_lost_admission_names_the_winner() -> None:
    sched = two_attempts()
    actions = step(sched, 20.0, [finished(sched, 0, 0, end=19.0), finished(sched, 0, 1, end=19.5)])
    assert actions == [Admit(0, 0), Discard(0, 1, "attempt 0 was admitted first"), CompleteStage(admitted={0: 0})]
    sched.handle(AdmissionLost(0, 0, 1))
    assert sched.revised(actions[1]) is None  # the winner's output is the stage's result
    assert sched.revised(actions[2]) == CompleteStage(admitted={0: 1})


def test_another_controllers_winner_counts_in_the_baseline_from_its_observed_end() -> None:
    sched = scheduler(2, **SPECULATIVE)
    restore(sched, [Attempt(0, 0, "local-a", S.RUNNING, deploying_at=0.0),
                    Attempt(0, 1, "local-b", S.RUNNING, speculative=True, deploying_at=5.0),
                    Attempt(1, 0, "local-a", S.RUNNING, deploying_at=0.0)], {}, {})
    step(sched, 20.0, [finished(sched, 0, 0, end=19.0)])
    sched.handle(AdmissionLost(0, 0, 1))
    # The winner's end is not observed yet: it is no finisher of 0 s that would make every attempt slow.
    assert step(sched, 20.5) == [] and sched.baseline is None
    step(sched, 21.0, [finished(sched, 0, 1, end=20.0)])
    assert sched.baseline is not None and sched.baseline.seconds == 2.0 * 15.0


def test_canceling_attempt_reporting_failed_is_canceled_not_a_failure() -> None:
    sched = two_attempts(max_failures_per_subtask=0)
    step(sched, 20.0, [finished(sched, 0, 1, end=19.0)])
    actions = step(sched, 21.0, [failed(sched, 0, 0, end=21.0, cause="killed by SIGTERM")])
    assert sched.attempts[0][0].state == S.CANCELED
    assert sched.failures(0) == 0
    assert sched.failure_causes() == []
    assert of(actions, FailStage) == []
    assert actions == [CompleteStage(admitted={0: 1})]


def test_canceling_attempt_reported_scheduled_stays_canceling() -> None:
    sched = scheduler(1)
    restore(sched, [Attempt(0, 0, "local-a", S.RUNNING, deploying_at=0.0),
                   Attempt(0, 1, "local-b", S.SCHEDULED, speculative=True)], {}, {})
    step(sched, 20.0, [finished(sched, 0, 0, end=19.0)])
    step(sched, 21.0, [seen(sched, 0, 1, S.SCHEDULED)])
    assert sched.attempts[0][1].state == S.CANCELING
    step(sched, 22.0, [failed(sched, 0, 1, end=22.0)])
    assert sched.failures(0) == 0


def test_stage_complete_when_every_subtask_is_admitted() -> None:
    sched = scheduler(2)
    step(sched, 0.0)
    start_all(sched, 1.0)
    assert of(step(sched, 5.0, [finished(sched, 0, end=5.0)]), CompleteStage) == []
    actions = step(sched, 6.0, [finished(sched, 1, end=6.0)])
    assert of(actions, CompleteStage) == [CompleteStage(admitted={0: 0, 1: 0})]


# -- speculation --------------------------------------------------------------------------------


def test_speculation_is_off_by_default() -> None:
    sched = straggler(baseline_lower_bound=0.0)
    assert sched.config.enabled is False
    assert sched.speculation_status.startswith("off: disabled")
    for now in (15.0, 100.0, 10_000.0):
        actions = step(sched, now)
        assert of(actions, BlockNode) == [] and of(actions, Launch) == []
    assert sched.slow_subtasks == frozenset() and sched.baseline is None
    assert sched.blocklist.active(10_000.0) == {}


def test_speculation_blocker_turns_speculation_off_and_says_why() -> None:
    sched = straggler(**SPECULATIVE, speculation_blocker="sink FooSink does not support concurrent attempts")
    assert sched.speculation_status == "off: sink FooSink does not support concurrent attempts"
    assert not sched.speculation_enabled
    for now in (15.0, 1000.0):
        actions = step(sched, now)
        assert of(actions, BlockNode) == [] and of(actions, Launch) == []


def test_speculation_status_on() -> None:
    assert scheduler(1, **SPECULATIVE).speculation_status == "on"


def test_slow_attempt_blocks_its_node_and_gets_a_speculative_copy_elsewhere() -> None:
    sched = straggler(**SPECULATIVE)
    assert of(step(sched, 14.9), Launch) == []  # 13.9 s of execution < 15 s baseline
    assert sched.baseline.seconds == pytest.approx(15.0)
    actions = step(sched, 16.0)
    assert sched.slow_subtasks == frozenset({3})
    blocks = of(actions, BlockNode)
    assert [(b.node, b.until) for b in blocks] == [("local-b", 76.0)]
    spec = of(actions, Launch)
    assert [(a.subtask, a.attempt, a.target, a.speculative) for a in spec] == [(3, 1, "local-a", True)]
    assert sched.attempts[3][1].speculative


def test_speculative_copy_goes_to_an_unblocked_target() -> None:
    # local-a and local-b share node n1; the slow attempt on local-a blocks n1, so the copy must skip
    # the free local-b (which would win on index) and go to local-c.
    sched = scheduler(3, **SPECULATIVE, baseline_ratio=0.5,
                      targets=targets(("local-a", 1, "n1"), ("local-b", 1, "n1"), ("local-c", 1, "n2")))
    assert launched(step(sched, 0.0)) == [(0, 0, "local-a"), (1, 0, "local-b"), (2, 0, "local-c")]
    start_all(sched, 0.0)
    step(sched, 10.0, [finished(sched, 1, end=10.0), finished(sched, 2, end=10.0)])
    actions = step(sched, 15.0)
    assert [b.node for b in of(actions, BlockNode)] == ["n1"]
    assert launched(actions) == [(0, 1, "local-c")]


def test_slow_node_reported_by_the_attempt_is_blocked() -> None:
    sched = straggler(**SPECULATIVE)
    actions = step(sched, 16.0, [seen(sched, 3, 0, S.RUNNING, node="host-7")])
    assert [b.node for b in of(actions, BlockNode)] == ["host-7"]


def test_speculative_winner_counts_as_effective_speculative_execution() -> None:
    sched = straggler(**SPECULATIVE)
    step(sched, 16.0)
    step(sched, 17.0, [running(sched, 3, 1, at=17.0)])
    assert sched.effective_speculative_executions() == 0
    actions = step(sched, 20.0, [finished(sched, 3, 1, end=20.0)])
    assert of(actions, Admit) == [Admit(3, 1)]
    assert [(c.subtask, c.attempt) for c in of(actions, Cancel)] == [(3, 0)]
    assert sched.effective_speculative_executions() == 1
    actions = step(sched, 21.0, [seen(sched, 3, 0, S.CANCELED, end_at=21.0)])
    assert of(actions, CompleteStage) == [CompleteStage(admitted={0: 0, 1: 0, 2: 0, 3: 1})]


def test_original_winning_is_not_an_effective_speculative_execution() -> None:
    sched = straggler(**SPECULATIVE)
    step(sched, 16.0)
    step(sched, 20.0, [finished(sched, 3, 0, end=20.0)])
    assert sched.admitted[3] == 0
    assert sched.effective_speculative_executions() == 0


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_max_concurrent_executions_caps_live_attempts(limit: int) -> None:
    sched = scheduler(4, **SPECULATIVE, max_concurrent_executions=limit,
                      targets=targets(("a", 1), ("b", 1), ("c", 1), ("d", 1)))
    step(sched, 0.0)
    start_all(sched, 0.0)
    step(sched, 10.0, [finished(sched, s, end=10.0) for s in (0, 1, 2)])
    copies = []
    for now in range(15, 40):
        copies += of(step(sched, float(now)), Launch)
        assert live_count(sched, 3) <= limit
    assert [(c.subtask, c.speculative) for c in copies] == [(3, True)] * (limit - 1)
    assert live_count(sched, 3) == limit
    assert len({sched.attempts[3][n].target for n in sched.attempts[3]}) == limit  # never two on one target


def test_blocked_node_gets_new_attempts_again_after_block_duration() -> None:
    sched = scheduler(4, **SPECULATIVE, baseline_ratio=0.25, block_slow_node_duration=30.0,
                      targets=targets(("local-a", 1), ("local-b", 1)))
    assert launched(step(sched, 0.0)) == [(0, 0, "local-a"), (1, 0, "local-b")]
    start_all(sched, 1.0, deploy=1.0)
    actions = step(sched, 11.0, [finished(sched, 0, end=11.0)])  # baseline: 1 finisher, 10 s -> 15 s
    assert launched(actions) == [(2, 0, "local-a")]
    actions = step(sched, 16.0)  # subtask 1 on local-b has run 15 s
    assert [(b.node, b.until) for b in of(actions, BlockNode)] == [("local-b", 46.0)]
    assert launched(actions) == []  # the only unblocked target (local-a) is full
    # Subtask 1 finishes: local-b is free but still blocked, so subtask 3 waits.
    assert launched(step(sched, 20.0, [finished(sched, 1, end=20.0)])) == []
    assert launched(step(sched, 45.9)) == []
    assert launched(step(sched, 46.0)) == [(3, 0, "local-b")]
    assert sched.blocklist.active(46.0) == {}


def test_larger_split_is_judged_per_input_byte() -> None:
    # Finishers read 64 bytes in 10 s: baseline 15 s; subtask 3 reads 3x as much, so it gets 45 s.
    sched = straggler(**SPECULATIVE, input_bytes={0: 64, 1: 64, 2: 64, 3: 192})
    for now in (15.0, 30.0, 44.9):
        assert of(step(sched, now), Launch) == []
    assert sched.slow_subtasks == frozenset()
    assert launched(step(sched, 45.0)) == [(3, 1, "local-a")]


def test_zero_block_duration_speculates_without_blocking() -> None:
    sched = straggler(**SPECULATIVE, block_slow_node_duration=0.0)
    actions = step(sched, 16.0)
    assert of(actions, BlockNode) == []
    assert launched(actions) == [(3, 1, "local-a")]


def test_peak_slow_remembers_the_most_simultaneous_slow_subtasks() -> None:
    sched = scheduler(4, **SPECULATIVE, baseline_ratio=0.5)
    step(sched, 0.0)
    start_all(sched, 0.0)
    step(sched, 10.0, [finished(sched, 0, end=10.0), finished(sched, 2, end=10.0)])  # both on local-a
    actions = step(sched, 15.0)
    assert sched.slow_subtasks == frozenset({1, 3})
    assert sched.peak_slow == 2
    assert [b.node for b in of(actions, BlockNode)] == ["local-b"]  # one block per node
    assert sorted(launched(actions)) == [(1, 1, "local-a"), (3, 1, "local-a")]
    step(sched, 20.0, [finished(sched, 1, 1, end=20.0)])
    assert sched.slow_subtasks == frozenset({3})
    assert sched.peak_slow == 2


# -- failures -----------------------------------------------------------------------------------


def test_failure_while_a_sibling_may_finish_launches_nothing() -> None:
    sched = two_attempts()
    actions = step(sched, 20.0, [failed(sched, 0, 0, end=20.0)])
    assert actions == []
    assert sched.failed is None


def test_failure_with_no_sibling_left_launches_a_replacement_with_the_next_number() -> None:
    sched = two_attempts()
    step(sched, 20.0, [failed(sched, 0, 0, end=20.0)])
    actions = step(sched, 21.0, [failed(sched, 0, 1, end=21.0)])
    replacements = of(actions, Launch)
    assert [(a.subtask, a.attempt, a.speculative, a.reason) for a in replacements] == [
        (0, 2, False, "restart after failure")]


def test_replacement_after_single_failure() -> None:
    sched = scheduler(1)
    step(sched, 0.0)
    actions = step(sched, 5.0, [failed(sched, 0, 0, end=5.0)])
    assert launched(actions) == [(0, 1, "local-a")]


def test_exceeding_max_failures_fails_the_stage_and_cancels_live_attempts() -> None:
    sched = scheduler(2, max_failures_per_subtask=1)
    step(sched, 0.0)
    start_all(sched, 0.0)
    first = step(sched, 5.0, [failed(sched, 0, 0, end=5.0, cause="OOM")])
    assert of(first, FailStage) == [] and launched(first) == [(0, 1, "local-a")]
    actions = step(sched, 9.0, [failed(sched, 0, 1, end=9.0, cause="disk full")])
    fail = of(actions, FailStage)
    assert len(fail) == 1 and fail[0] is sched.failed
    assert "subtask 0 failed 2 times" in fail[0].reason
    assert "max_failures_per_subtask = 1" in fail[0].reason
    assert len(fail[0].causes) == 2
    assert "subtask 0 attempt 0 on local-a" in fail[0].causes[0] and "OOM" in fail[0].causes[0]
    assert "subtask 0 attempt 1 on local-a" in fail[0].causes[1] and "disk full" in fail[0].causes[1]
    assert fail[0].failed_keys == ((0, 0), (0, 1))  # where the task log points for these causes' logs
    assert [(c.subtask, c.attempt, c.reason) for c in of(actions, Cancel)] == [(1, 0, "stage failed")]
    assert of(actions, Launch) == []
    assert step(sched, 10.0) == []


def test_zero_max_failures_fails_on_first_failure() -> None:
    sched = scheduler(1, max_failures_per_subtask=0)
    step(sched, 0.0)
    actions = step(sched, 5.0, [failed(sched, 0, 0, end=5.0)])
    assert len(of(actions, FailStage)) == 1
    assert of(actions, Launch) == []


def test_failure_of_a_loser_after_admission_is_ignored() -> None:
    sched = scheduler(1, max_failures_per_subtask=0)
    restore(sched, [Attempt(0, 0, "local-a", S.RUNNING, deploying_at=0.0),
                   Attempt(0, 1, "local-b", S.RUNNING, deploying_at=0.0)], {}, {})
    step(sched, 10.0, [finished(sched, 0, 0, end=10.0), failed(sched, 0, 1, end=10.0)])
    assert sched.failed is None
    assert sched.completed


# -- restore and reuse --------------------------------------------------------------------------


def test_restore_with_running_attempts_launches_no_duplicates() -> None:
    sched = scheduler(4)
    restore(sched, [Attempt(0, 0, "local-a", S.RUNNING, deploying_at=5.0),
                   Attempt(1, 0, "local-b", S.CREATED, created_at=6.0),
                   Attempt(2, 0, "local-a", S.FINISHED, deploying_at=1.0, end_at=9.0)],
                  admitted={2: 0}, blocked={})
    actions = step(sched, 100.0)
    assert launched(actions) == [(3, 0, "local-a")]
    assert of(actions, Admit) == []
    assert of(step(sched, 101.0), Launch) == []


def test_restore_continues_attempt_numbers() -> None:
    sched = scheduler(1)
    restore(sched, [Attempt(0, 0, "local-a", S.FAILED), Attempt(0, 1, "local-b", S.CANCELED)], {}, {})
    assert launched(step(sched, 100.0)) == [(0, 2, "local-a")]


def test_restore_keeps_blocked_nodes() -> None:
    sched = scheduler(4)
    restore(sched, [], {}, {"local-a": 50.0})
    assert launched(step(sched, 0.0)) == [(0, 0, "local-b"), (1, 0, "local-b")]
    assert launched(step(sched, 50.0)) == [(2, 0, "local-a"), (3, 0, "local-a")]


def test_restore_cancels_running_siblings_of_an_admitted_subtask() -> None:
    # The controller died after persisting the admission but before cancelling the loser.
    sched = scheduler(1)
    restore(sched, [Attempt(0, 0, "local-a", S.RUNNING, deploying_at=0.0),
                   Attempt(0, 1, "local-b", S.FINISHED, speculative=True, deploying_at=5.0, end_at=9.0)],
                  admitted={0: 1}, blocked={})
    actions = step(sched, 100.0)
    assert [(c.subtask, c.attempt) for c in of(actions, Cancel)] == [(0, 0)]


def test_reused_subtasks_get_no_attempts() -> None:
    sched = scheduler(3, reused=frozenset({1}))
    actions = step(sched, 0.0)
    assert launched(actions) == [(0, 0, "local-a"), (2, 0, "local-b")]
    assert sched.attempts[1] == {}
    start_all(sched, 0.0)
    actions = step(sched, 5.0, [finished(sched, 0, end=5.0), finished(sched, 2, end=5.0)])
    assert of(actions, Launch) == []
    assert of(actions, CompleteStage) == [CompleteStage(admitted={0: 0, 2: 0})]
    assert sched.done_subtasks() == {0, 1, 2}


def test_all_subtasks_reused_completes_without_launching() -> None:
    sched = scheduler(2, reused=frozenset({0, 1}))
    assert step(sched, 0.0) == [CompleteStage(admitted={})]
