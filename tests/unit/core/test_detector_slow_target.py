"""A target known to be slow explains its attempts' time: they are held to the plain baseline, not per byte."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.detector import Baseline, SlowWatch, judge_one, judge_slow
from airflow_provider_speculative.core.messages import AttemptObserved, Launch, TargetsObserved, Tick
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.speed import SLOW_FACTOR, Speeds
from airflow_provider_speculative.core.states import Attempt, AttemptState

# 20 s for a 100-byte split (0.2 s per byte with M = 2 over a 0.1 s/byte median), plain 20 s.
BASELINE = Baseline(seconds=20.0, per_byte=0.2, source="run", floor=2.0, startup=1.0, factor=2.0)


def running(subtask: int, target: str, *, deploy: float = 0.0, size: int = 100) -> Attempt:
    return Attempt(subtask=subtask, number=0, target=target, state=AttemptState.RUNNING, deploying_at=deploy,
                   ready_at=deploy + 1.0, input_bytes=size)


def test_a_large_split_on_a_slow_target_is_held_to_the_plain_baseline() -> None:
    big = running(0, "slow", size=400)  # per byte: 80 s
    assert judge_one(big, BASELINE, 30.0) is None
    why = judge_one(big, BASELINE, 30.0, slow_target=True)
    assert why == "ran 30.0s >= 20.0s (run baseline; its target is slow, so not per byte)"
    # Below the plain seconds nothing is slow, on any target.
    assert judge_one(big, BASELINE, 19.0, slow_target=True) is None
    # A split no larger than the plain baseline's: the same threshold, the same reason as anywhere.
    small = running(1, "slow", size=50)
    assert judge_one(small, BASELINE, 20.0, slow_target=True) == "ran 20.0s >= 20.0s (run baseline)"
    assert [a.subtask for a, _ in judge_slow([big, running(2, "fast", size=400)], BASELINE, 30.0,
                                             slow_targets={"slow"})] == [0]


def test_a_projection_on_a_slow_target_still_prices_the_copy_by_its_split() -> None:
    # 400 bytes: a copy needs 1 s + 80 s / 2 = 41 s. Reported 10 % read after 10 s: projected 100 s, 90 s left.
    attempt = running(0, "slow", size=400)
    attempt.progress = {"bytes_read": 40, "input_bytes": 400}
    baseline = Baseline(seconds=20.0, per_byte=0.2, source="run", floor=2.0, startup=1.0, factor=2.0,
                        read_ratio=1.0)
    assert judge_one(attempt, baseline, 10.0, slow_target=True) == (
        "projected 100.0s from 10% read in 10.0s; a copy needs ~41.0s")
    # 40 % read after 19.9 s: projected 49.8 s, 29.9 s left, under the 41 s the copy of a 400-byte split needs
    # (priced at the plain baseline's 11 s it would be copied).
    attempt.progress = {"bytes_read": 160, "input_bytes": 400}
    assert judge_one(attempt, baseline, 19.9, slow_target=True) is None


def test_the_slow_watch_judges_a_targets_attempts_from_the_step_it_is_called_slow() -> None:
    watch = SlowWatch({0: 400, 1: 400, 2: 50})
    attempts = [running(0, "slow", size=400), running(1, "fast", size=400), running(2, "slow", size=50)]
    for attempt in attempts:
        watch.update(attempt.subtask, [attempt])
    for now, slow in ((25.0, frozenset()), (25.0, frozenset({"slow"})), (26.0, frozenset({"slow"})),
                      (27.0, frozenset()), (85.0, frozenset()), (85.0, frozenset({"fast", "slow"}))):
        expected = judge_slow(attempts, BASELINE, now, {0: 400, 1: 400, 2: 50}, slow)
        assert watch.judge(BASELINE, now, slow) == expected, (now, slow)
    # Subtask 0 waited in the heap until 80 s (its per-byte bound) and was judged at 25 s once its target was slow.
    assert [a.subtask for a, _ in watch.judge(BASELINE, 25.0, {"slow"})] == [0, 2]
    assert [a.subtask for a, _ in watch.judge(BASELINE, 25.0, ())] == [2]
    # An attempt replaced or gone leaves its target's list.
    watch.update(0, [])
    assert [a.subtask for a, _ in watch.judge(BASELINE, 30.0, {"slow"})] == [2]


def _stage(history: dict[str, float]) -> StageScheduler:
    """Three one-slot targets, four subtasks: 0-2 of 100 bytes, 3 of 400 bytes (a 4x larger split)."""
    targets = tuple(Target(name=n) for n in ("fast", "other", "slow"))
    config = SpeculativeConfig(enabled=True, targets=targets, block_slow_node_duration=0.0)
    return StageScheduler(parallelism=4, config=config, input_bytes={0: 100, 1: 100, 2: 100, 3: 400},
                          target_history=history, history_source={t: "history" for t in history})


def _launch_on(sched: StageScheduler, subtask: int, target: str, at: float) -> Attempt:
    return Attempt(subtask=subtask, number=0, target=target, state=AttemptState.RUNNING, deploying_at=at,
                   ready_at=at + 0.5, input_bytes=sched.input_bytes[subtask], node=target)


def _copies_at(history: dict[str, float], now: float) -> list[Launch]:
    """The big split runs on ``slow`` from 0 s; the small ones finished at 10 s: which copies does ``now`` bring?"""
    sched = _stage(history)
    free = {"fast": 0, "other": 0, "slow": 0}
    sched.handle(TargetsObserved(free=dict(free), capacity={"fast": 1, "other": 1, "slow": 1}), Tick(0.0))
    done = []
    for subtask, target in ((0, "fast"), (1, "other"), (2, "fast")):
        attempt = _launch_on(sched, subtask, target, 0.0)
        attempt.state, attempt.end_at = AttemptState.FINISHED, 10.0
        done.append(AttemptObserved(attempt))
    big = AttemptObserved(_launch_on(sched, 3, "slow", 0.0))
    sched.handle(*done, big, TargetsObserved(free={"fast": 1, "other": 1, "slow": 0},
                                             capacity={"fast": 1, "other": 1, "slow": 1}), Tick(10.0))
    actions = sched.handle(TargetsObserved(free={"fast": 1, "other": 1, "slow": 0},
                                           capacity={"fast": 1, "other": 1, "slow": 1}), Tick(now))
    return [a for a in actions if isinstance(a, Launch) and a.speculative]


def test_the_stage_copies_a_large_split_on_a_target_history_calls_slow_at_the_plain_baseline() -> None:
    # Three 10 s finishers: plain baseline 15 s, per byte 0.15 s, so 60 s for the 400-byte split.
    copies = _copies_at({"slow": 4.0}, 16.0)
    assert [(c.subtask, c.target) for c in copies] == [(3, "fast")]
    assert "its target is slow, so not per byte" in copies[0].reason
    # The same split where nothing says its target is slow: its size earns it 60 s.
    assert _copies_at({}, 16.0) == []
    assert [c.subtask for c in _copies_at({}, 61.0)] == [3]
    # A target under SLOW_FACTOR is not slow: noise does not take the per-byte allowance away.
    assert _copies_at({"slow": SLOW_FACTOR - 0.1}, 16.0) == []


def test_slow_targets_are_those_is_slow_calls_slow() -> None:
    speeds = Speeds(slowness={"a": 1.0, "b": SLOW_FACTOR, "c": 1.4, "d": 8.0}, source={})
    assert speeds.slow_targets == frozenset({"b", "d"}) == frozenset(t for t in "abcd" if speeds.is_slow(t))
    assert speeds.slow_targets is speeds.slow_targets
    assert Speeds(slowness={}, source={}).slow_targets == frozenset()
    with pytest.raises(AttributeError):
        speeds.slowness = {}  # type: ignore[misc]
