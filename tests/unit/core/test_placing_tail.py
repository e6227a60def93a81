"""The last wave's tail copies (core/placing.py: Placement.tail_copies): long copies before fresh originals."""

from __future__ import annotations

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.messages import Action, Launch
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import AttemptState
from tests.unit.core.scheduler_helpers import step


def _launched(actions: list[Action]) -> list[tuple[int, int, str, bool]]:
    return [(a.subtask, a.attempt, a.target, a.speculative) for a in actions if isinstance(a, Launch)]


def _report(sched: StageScheduler, now: float, subtasks: list[int], state: AttemptState) -> list[Action]:
    """Report each subtask's latest attempt RUNNING (deploying at ``now``) or FINISHED at ``now``."""
    updates = []
    for subtask in subtasks:
        attempt = sched.attempts[subtask][max(sched.attempts[subtask])]
        deploying = attempt.deploying_at if attempt.deploying_at is not None else now
        updates.append(attempt.__class__(**{**attempt.__dict__, "state": state, "deploying_at": deploying,
                                             "end_at": now if state == AttemptState.FINISHED else None}))
    return step(sched, now, updates)


def _stage(parallelism: int) -> StageScheduler:
    """Two fast targets and one slow one, one slot each; every subtask the same size (10 s on a fast target).

    Subtask 2 runs on the slow target from 0 s, subtasks 0, 1, 3 and 4 take 10 s each on the fast ones, so
    at 20 s the baseline (1.5 x 10 s) calls subtask 2 slow while the rest still wait for an original.
    """
    config = SpeculativeConfig(enabled=True, baseline_lower_bound=0.0, baseline_ratio=0.5,
                               targets=(Target(name="fast-a", slots=1), Target(name="fast-b", slots=1),
                                        Target(name="slow", slots=1)))
    sched = StageScheduler(parallelism=parallelism, config=config, input_bytes=dict.fromkeys(range(parallelism), 100))
    assert _launched(step(sched, 0.0)) == [(0, 0, "fast-a", False), (1, 0, "fast-b", False), (2, 0, "slow", False)]
    _report(sched, 0.0, [0, 1, 2], AttemptState.RUNNING)
    assert [s for s, *_ in _launched(_report(sched, 10.0, [0, 1], AttemptState.FINISHED))] == [3, 4]
    _report(sched, 10.0, [3, 4], AttemptState.RUNNING)
    return sched


def test_in_the_last_wave_the_copy_of_a_long_original_goes_before_the_fresh_originals() -> None:
    sched = _stage(7)  # two originals (5, 6) wait for the two fast slots: the last wave
    actions = _report(sched, 20.0, [3, 4], AttemptState.FINISHED)
    assert sched.slow_subtasks == frozenset({2})
    # Subtask 2 has run 20 s where only unfinished attempts bound the slow target's slowness (2x so far):
    # taken to need as long again, 20 s more, against 10 s for its copy and for a fresh original.
    assert _launched(actions) == [(2, 1, "fast-a", True), (5, 0, "fast-b", False)]


def test_before_the_last_wave_fresh_originals_go_first() -> None:
    sched = _stage(9)  # four originals (5 to 8) wait for two fast slots: not the last wave yet
    actions = _report(sched, 20.0, [3, 4], AttemptState.FINISHED)
    assert sched.slow_subtasks == frozenset({2})
    assert _launched(actions) == [(5, 0, "fast-a", False), (6, 0, "fast-b", False)]


def test_in_the_last_wave_a_slow_target_takes_no_fresh_original_while_a_faster_one_is_usable() -> None:
    # No node block: the slow target stays pickable after its attempt is judged slow.
    config = SpeculativeConfig(enabled=True, baseline_lower_bound=0.0, baseline_ratio=0.5, block_slow_node_duration=0,
                               targets=(Target(name="fast-a", slots=1), Target(name="fast-b", slots=1),
                                        Target(name="slow", slots=1)))
    sizes = {**dict.fromkeys(range(9), 100), 5: 300, 6: 300}
    sched = StageScheduler(parallelism=9, config=config, input_bytes=sizes)
    step(sched, 0.0)
    _report(sched, 0.0, [0, 1, 2], AttemptState.RUNNING)
    _report(sched, 10.0, [0, 1], AttemptState.FINISHED)
    _report(sched, 10.0, [3, 4], AttemptState.RUNNING)
    # Four originals wait for two fast slots: 5 and 6 (30 s each on a fast target) take them.
    assert [s for s, *_ in _launched(_report(sched, 20.0, [3, 4], AttemptState.FINISHED))] == [5, 6]
    _report(sched, 22.0, [5, 6], AttemptState.RUNNING)
    # Subtask 2 ends on the slow target after 22 s (2.2x slower); 7 and 8 now fit in the fast slots. The
    # hold planner alone places 7 there (22 s against 10 s of waiting plus 10 s on a fast target, within
    # its margin): the last wave holds it for a fast slot instead.
    actions = _report(sched, 22.0, [2], AttemptState.FINISHED)
    assert _launched(actions) == []
    assert "this is the last wave" in sched.held_back[7][1]
