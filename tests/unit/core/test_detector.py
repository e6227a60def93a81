"""FLIP-168 slow-task baseline: N·R finishers, median x multiplier, lower bound, per-byte normalisation."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.detector import Baseline, compute_baseline, find_slow, required_finished
from airflow_provider_speculative.core.states import Attempt, AttemptState


def finished(subtask: int, *, deploy: float, end: float, created: float = 0.0, nbytes: int | None = None) -> Attempt:
    return Attempt(subtask=subtask, number=0, target="t", state=AttemptState.FINISHED, created_at=created,
                   deploying_at=deploy, end_at=end, input_bytes=nbytes)


def running(subtask: int, *, deploy: float, state: AttemptState = AttemptState.RUNNING,
            nbytes: int | None = None) -> Attempt:
    return Attempt(subtask=subtask, number=0, target="t", state=state, created_at=0.0, deploying_at=deploy,
                   input_bytes=nbytes)


def baseline(parallelism: int, done: list[Attempt], *, ratio: float = 0.75, multiplier: float = 1.5,
             lower_bound: float | None = 0.0, input_bytes: dict[int, int] | None = None,
             normalize: bool = True, early: bool = False) -> Baseline | None:
    return compute_baseline(parallelism, done, ratio=ratio, multiplier=multiplier, lower_bound=lower_bound,
                            input_bytes=input_bytes, normalize_by_input_bytes=normalize, early=early)


@pytest.mark.parametrize(
    ("parallelism", "ratio", "expected"),
    [
        (4, 0.75, 3),
        (5, 0.5, 3),    # 2.5 rounds half UP (Python's round() would give 2)
        (9, 0.5, 5),    # 4.5 -> 5 (banker's rounding would give 4)
        (10, 0.25, 3),  # 2.5 -> 3
        (10, 0.24, 2),  # 2.4 -> 2
        (4, 1.0, 4),
        (1, 0.1, 1),    # at least one subtask must finish
        (10, 0.01, 1),
    ],
)
def test_required_finished_rounds_half_up(parallelism: int, ratio: float, expected: int) -> None:
    assert required_finished(parallelism, ratio) == expected


def test_no_baseline_and_no_slow_tasks_before_ratio_is_reached() -> None:
    # N=5, R=0.5 needs 3 finishers; 2 is not enough, however slow the running attempts are.
    done = [finished(0, deploy=0, end=10), finished(1, deploy=0, end=10)]
    assert baseline(5, done, ratio=0.5) is None
    assert find_slow([running(2, deploy=0)], None, now=10_000.0) == []


def test_baseline_exists_once_ratio_is_reached() -> None:
    done = [finished(i, deploy=0, end=10) for i in range(3)]
    result = baseline(5, done, ratio=0.5, multiplier=1.5)
    assert result is not None
    assert result.seconds == pytest.approx(15.0)


def test_baseline_uses_median_of_the_earliest_finishers_by_end_time() -> None:
    # N=4, R=0.5 -> the 2 earliest finishers (ends 10 and 12, times 4 and 8) define T = 6.
    # The late finisher with a huge execution time must not count, whatever the list order.
    done = [
        finished(3, deploy=0, end=1000),   # time 1000, finished last
        finished(1, deploy=4, end=12),     # time 8
        finished(0, deploy=6, end=10),     # time 4
    ]
    result = baseline(4, done, ratio=0.5, multiplier=2.0)
    assert result is not None
    assert result.seconds == pytest.approx(12.0)  # median(4, 8) * 2


def test_baseline_median_with_odd_count() -> None:
    done = [finished(0, deploy=0, end=5), finished(1, deploy=0, end=7), finished(2, deploy=0, end=30)]
    result = baseline(3, done, ratio=1.0, multiplier=1.0)
    assert result is not None
    assert result.seconds == pytest.approx(7.0)


def test_lower_bound_wins_when_larger() -> None:
    done = [finished(i, deploy=0, end=10) for i in range(4)]
    assert baseline(4, done, lower_bound=60.0).seconds == pytest.approx(60.0)
    assert baseline(4, done, lower_bound=5.0).seconds == pytest.approx(15.0)


def test_execution_time_counts_from_deploying_not_creation() -> None:
    # Created at 0, deploying at 90, finished at 100: execution time is 10, not 100.
    done = [finished(i, created=0, deploy=90, end=100) for i in range(4)]
    result = baseline(4, done, multiplier=1.0)
    assert result.seconds == pytest.approx(10.0)
    # A running attempt created long ago but deploying only at 95 is not slow at 100.
    late_start = Attempt(subtask=9, number=0, target="t", state=AttemptState.RUNNING, created_at=0.0,
                         deploying_at=95.0)
    assert find_slow([late_start], result, now=100.0) == []
    assert find_slow([late_start], result, now=105.0) == [late_start]


def test_running_attempt_at_exactly_the_baseline_is_slow() -> None:
    limit = Baseline(seconds=15.0)
    a = running(0, deploy=100.0)
    assert find_slow([a], limit, now=114.999) == []
    assert find_slow([a], limit, now=115.0) == [a]


@pytest.mark.parametrize("state", [AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING])
def test_every_executing_state_can_be_slow(state: AttemptState) -> None:
    a = running(0, deploy=0.0, state=state)
    assert find_slow([a], Baseline(seconds=10.0), now=20.0) == [a]


@pytest.mark.parametrize("state", [AttemptState.CREATED, AttemptState.SCHEDULED, AttemptState.FINISHED,
                                   AttemptState.CANCELING, AttemptState.FAILED, AttemptState.CANCELED])
def test_non_executing_attempts_are_never_slow(state: AttemptState) -> None:
    a = Attempt(subtask=0, number=0, target="t", state=state, deploying_at=0.0, end_at=500.0)
    assert find_slow([a], Baseline(seconds=10.0), now=1000.0) == []


def per_byte_baseline(**kw) -> Baseline:
    # Three finishers of 64 bytes in 8 s each, multiplier 2: baseline 16 s and 0.25 s/byte
    # (powers of two keep the arithmetic exact).
    done = [finished(i, deploy=0, end=8) for i in range(3)]
    sizes = {0: 64, 1: 64, 2: 64, 3: 192, 4: 8}
    return baseline(4, done, multiplier=2.0, input_bytes=kw.pop("input_bytes", sizes), **kw)


def test_per_byte_baseline_is_median_seconds_per_byte_times_multiplier() -> None:
    result = per_byte_baseline()
    assert result.seconds == 16.0
    assert result.per_byte == 0.25


def test_large_split_is_not_slow_at_twice_the_baseline() -> None:
    result = per_byte_baseline()
    big = running(3, deploy=0.0)  # reads 3x the bytes of the baseline finishers
    sizes = {3: 192}
    assert find_slow([big], result, now=2 * result.seconds, input_bytes=sizes) == []
    assert find_slow([big], result, now=47.9, input_bytes=sizes) == []
    assert find_slow([big], result, now=48.0, input_bytes=sizes) == [big]  # 192 B * 0.25 s/B


def test_attempt_input_bytes_are_used_when_the_map_has_none() -> None:
    result = per_byte_baseline()
    big = running(3, deploy=0.0, nbytes=192)
    assert find_slow([big], result, now=32.0) == []
    assert find_slow([big], result, now=48.0) == [big]


def test_small_split_is_never_held_to_less_than_the_plain_baseline() -> None:
    result = per_byte_baseline()
    small = running(4, deploy=0.0)  # 8 bytes: the per-byte threshold alone would be only 2 s
    assert result.threshold(8) == 16.0
    assert find_slow([small], result, now=15.9, input_bytes={4: 8}) == []
    assert find_slow([small], result, now=16.0, input_bytes={4: 8}) == [small]


def test_threshold_without_normalisation_or_size_is_plain_seconds() -> None:
    assert Baseline(seconds=15.0).threshold(10_000) == 15.0
    assert Baseline(seconds=15.0, per_byte=0.15).threshold(None) == 15.0
    assert Baseline(seconds=15.0, per_byte=0.15).threshold(0) == 15.0


def test_normalisation_off_when_a_baseline_finisher_lacks_bytes() -> None:
    result = per_byte_baseline(input_bytes={0: 64, 1: 64, 3: 192})  # subtask 2 has no size
    assert result.per_byte is None
    big = running(3, deploy=0.0)
    assert find_slow([big], result, now=16.0, input_bytes={3: 192}) == [big]


def test_normalisation_off_by_config() -> None:
    result = per_byte_baseline(normalize=False)
    assert result.per_byte is None
    assert result.threshold(192) == 16.0


def test_normalisation_ignores_later_finishers_without_bytes() -> None:
    # Only the earliest N·R finishers form the baseline; a later one without a size does not matter.
    done = [finished(i, deploy=0, end=8) for i in range(3)] + [finished(3, deploy=0, end=50)]
    result = baseline(4, done, multiplier=2.0, input_bytes={0: 64, 1: 64, 2: 64})
    assert result.per_byte == 0.25


def test_time_waiting_for_hybrid_input_is_not_execution_time():
    # Deployed at 0, waited 0-40 s for producers (finished wait 30 s + a wait since 90 s): not slow work.
    waiting = Attempt(subtask=0, number=0, target="t", state=AttemptState.RUNNING, deploying_at=0.0,
                      input_wait=30.0, waiting_since=90.0)
    assert waiting.execution_time(100.0) == pytest.approx(60.0)
    done = Attempt(subtask=1, number=0, target="t", state=AttemptState.FINISHED, deploying_at=0.0, end_at=50.0,
                   input_wait=35.0)
    assert done.execution_time(100.0) == pytest.approx(15.0)


def test_an_attempt_waiting_for_its_producers_is_not_called_slow():
    done = [finished(i, deploy=0.0, end=10.0) for i in range(3)]
    base = baseline(4, done, ratio=0.75)
    assert base is not None and base.threshold(None) == pytest.approx(15.0)
    # 100 s since deploying, but 95 s of it waiting for hybrid input (still waiting since 10 s).
    waiter = Attempt(subtask=3, number=0, target="t", state=AttemptState.RUNNING, deploying_at=0.0,
                     waiting_since=10.0, input_wait=5.0)
    assert find_slow([waiter], base, now=100.0) == []
    worker = running(3, deploy=0.0)
    assert find_slow([worker], base, now=100.0) == [worker]


def started(attempt: Attempt, startup: float) -> Attempt:
    attempt.launched_at = attempt.deploying_at
    attempt.ready_at = (attempt.deploying_at or 0.0) + startup
    return attempt


def test_early_baseline_from_the_first_finisher_with_a_stricter_multiplier() -> None:
    # A one-wave stage of 2: N·R = 2 can never finish while the straggler holds its slot.
    done = [finished(0, deploy=0, end=10)]
    assert baseline(2, done) is None
    early = baseline(2, done, early=True)
    assert early is not None and early.source == "early" and early.finished == 1
    assert early.seconds == pytest.approx(20.0)  # 10 s x EARLY_MULTIPLIER (2), not x 1.5
    assert find_slow([running(1, deploy=0)], early, now=19.9) == []
    assert [a.subtask for a in find_slow([running(1, deploy=0)], early, now=20.0)] == [1]
    # Once N·R finished, FLIP-168's rule takes over.
    full = baseline(2, [*done, finished(1, deploy=0, end=12)], early=True)
    assert full is not None and full.source == "run" and full.seconds == pytest.approx(16.5)


def test_no_early_baseline_for_a_single_subtask() -> None:
    assert baseline(1, [], early=True) is None


def test_auto_lower_bound_is_twice_the_median_startup_at_least_one_second() -> None:
    done = [started(finished(i, deploy=0, end=3), startup) for i, startup in enumerate((1.0, 2.0, 4.0))]
    result = baseline(4, done, lower_bound=None)
    assert result is not None and result.floor_source == "startup" and result.startup == pytest.approx(2.0)
    assert result.floor == pytest.approx(4.0) and result.seconds == pytest.approx(4.5)  # max(3 x 1.5, 2 x 2)
    quick = [started(finished(i, deploy=0, end=0.4), 0.1) for i in range(3)]
    assert baseline(4, quick, lower_bound=None).floor == pytest.approx(1.0)
    # A configured bound wins and says so.
    configured = baseline(4, done, lower_bound=60.0)
    assert configured.floor_source == "configured" and configured.seconds == 60.0


def read(attempt: Attempt, share: float, planned: int = 1000) -> Attempt:
    attempt.progress = {"bytes_read": int(share * planned), "input_bytes": planned}
    return attempt


def test_progress_projection_calls_an_attempt_slow_before_its_time_reaches_the_threshold() -> None:
    done = [read(started(finished(i, deploy=0, end=10), 1.0), 1.0) for i in range(3)]
    result = baseline(4, done, lower_bound=None)  # threshold 15 s, expected 10 s, a copy ~11 s
    slow = running(3, deploy=0, nbytes=1000)
    slow.progress = {"bytes_read": 200, "input_bytes": 1000}
    # 20 % read in 6 s projects 30 s: 24 s left, more than the ~11 s a copy needs.
    assert find_slow([slow], result, now=6.0) == [slow]
    # Half read in 6 s projects 12 s: below the threshold, not slow.
    slow.progress = {"bytes_read": 500, "input_bytes": 1000}
    assert find_slow([slow], result, now=6.0) == []
    # Too little progress to project from, or not yet past the floor (2 s): not slow.
    slow.progress = {"bytes_read": 50, "input_bytes": 1000}
    assert find_slow([slow], result, now=6.0) == []
    slow.progress = {"bytes_read": 100, "input_bytes": 1000}
    assert find_slow([slow], result, now=1.5) == []


def test_projection_is_calibrated_by_what_finished_attempts_read() -> None:
    # Parquet column pruning: finished attempts read 40 % of their planned bytes in all. A running one
    # at 30 % of its planned bytes after 6 s is three quarters done (8 s projected), not slow.
    done = [read(started(finished(i, deploy=0, end=10), 1.0), 0.4) for i in range(3)]
    result = baseline(4, done, lower_bound=None)
    assert result is not None and result.read_ratio == pytest.approx(0.4)
    running_attempt = read(running(3, deploy=0, nbytes=1000), 0.3)
    assert find_slow([running_attempt], result, now=6.0) == []
    # Uncalibrated (no finished attempt reported bytes): no projection at all, only elapsed time counts.
    uncalibrated = baseline(4, [started(finished(i, deploy=0, end=10), 1.0) for i in range(3)], lower_bound=None)
    assert uncalibrated is not None and uncalibrated.read_ratio is None
    assert find_slow([read(running(3, deploy=0, nbytes=1000), 0.05)], uncalibrated, now=6.0) == []


def test_projection_does_not_copy_when_the_copy_would_end_later() -> None:
    done = [read(started(finished(i, deploy=0, end=10), 8.0), 1.0) for i in range(3)]
    result = baseline(4, done, lower_bound=0.0)  # a copy needs 8 s start-up + 10 s of work
    nearly = running(3, deploy=0, nbytes=1000)
    nearly.progress = {"bytes_read": 600, "input_bytes": 1000}  # 14 s elapsed projects 23.3 s: 9.3 s left
    assert find_slow([nearly], result, now=14.0) == []
