"""Slow-task detector: FLIP-168's execution-time baseline, made to engage on attempts that last seconds.

Three changes to Flink's rule, each because an attempt here is a Spark submission that lasts seconds,
not a Flink task that lasts minutes:

- **The lower bound is derived, not fixed** (``baseline_lower_bound = auto``): twice the median
  start-up time (launch to a ready Spark session) of the finished attempts, at least
  :data:`MIN_FLOOR` s. A copy costs at least one start-up, so calling an attempt slow before it has
  run twice that long cannot pay off; Flink's 60 s default never calls a 10 s attempt slow, and
  Spark's ``minTaskRuntime`` (100 ms) fits tasks that start in milliseconds.
- **An early baseline** before N·R subtasks finished: once one finished, the median of what finished
  times :data:`EARLY_MULTIPLIER` (stricter than ``baseline_multiplier``, since the first finishers are
  the fastest). It catches a straggler in a stage that runs in one wave, where N·R can never finish
  while the straggler holds its slot, and in the last subtasks of a stage.
- **Progress projection** (LATE, Zaharia et al. 2008), calibrated by the share of their planned bytes the
  finished attempts read (column pruning): an attempt that reports the share of its
  input read projects its execution time as ``elapsed / share``; it is slow when the projection
  reaches the threshold and a fresh copy (start-up + the expected time) would end before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import itemgetter
from statistics import median

from airflow_provider_speculative.core.states import Attempt, AttemptState

# The smallest derived lower bound: below it scheduling noise of the controller (its ~0.1-1 s steps)
# dominates any difference between attempts.
MIN_FLOOR = 1.0
# The early baseline's multiplier over the median of the first finishers (at least baseline_multiplier).
EARLY_MULTIPLIER = 2.0
# A progress share below this is too early to project from (one task of many may not have reported).
MIN_PROGRESS = 0.1


@dataclass(frozen=True)
class Baseline:
    """A stage's slow-task baseline. ``per_byte`` is set when time is compared per input byte.

    ``source`` says what decided it: ``run`` (N·R subtasks of this run finished, FLIP-168) or ``early``
    (fewer finished); ``floor`` is the lower bound in force and ``floor_source`` where it came from
    (``configured``, or ``startup`` for the derived bound). ``startup`` is the median start-up time.
    """

    seconds: float
    per_byte: float | None = None
    source: str = "run"
    floor: float = 0.0
    floor_source: str = "configured"
    startup: float | None = None
    finished: int = 0
    # The multiplier applied: threshold / factor is the time the baseline expects of an attempt.
    factor: float = 1.0
    # Median bytes read / planned input bytes of finished attempts: Parquet reads only the columns used,
    # so a finished attempt's share is below 1; None (never measured) disables progress projection.
    read_ratio: float | None = None

    def threshold(self, input_bytes: int | None) -> float:
        """Execution time at or over which an attempt reading ``input_bytes`` is slow.

        Normalisation only ever raises the threshold: a larger split earns proportionally more time,
        but a small split is not held to less than the plain baseline, because fixed costs (JVM start,
        scheduling) do not shrink with the input.
        """
        if self.per_byte is not None and input_bytes:
            return max(self.seconds, self.per_byte * input_bytes)
        return self.seconds


def required_finished(parallelism: int, ratio: float) -> int:
    """N·R rounded half up, as Flink's ``Math.round``; at least one subtask must finish."""
    return max(1, math.floor(parallelism * ratio + 0.5))


def derived_floor(finished: list[Attempt], lower_bound: float | None) -> tuple[float, str, float | None]:
    """The lower bound in force, where it came from, and the median start-up time it was derived from."""
    return _floor([a.startup_seconds for a in finished], lower_bound)


def _floor(startup_times: list[float | None], lower_bound: float | None) -> tuple[float, str, float | None]:
    startups = [s for s in startup_times if s is not None]
    startup = median(startups) if startups else None
    if lower_bound is not None:
        return lower_bound, "configured", startup
    return max(MIN_FLOOR, 2.0 * (startup or 0.0)), "startup", startup


# What compute_baseline reads of one finished attempt: the attempt, (end, subtask), execution time,
# start-up time, share of its planned bytes read.
_Facts = tuple[Attempt, tuple[float, int], float, float | None, float | None]


@dataclass
class FinishedFacts:
    """What :func:`compute_baseline` reads of each finished attempt, kept per attempt between calls.

    A stage recomputes its baseline at every step that admits an attempt; deriving every finished
    attempt's times again made each such step O(finished) attribute walks. A finished attempt is replaced,
    never changed in place (StageScheduler's rule), so the same object means the same facts.
    """

    facts: dict[tuple[int, int], _Facts] = field(default_factory=dict)

    def of(self, attempt: Attempt) -> _Facts:
        """The attempt's facts, derived again only if another object stands for it now."""
        known = self.facts.get((attempt.subtask, attempt.number))
        if known is None or known[0] is not attempt:
            end = attempt.end_at or 0.0
            known = (attempt, (end, attempt.subtask), attempt.execution_time(end), attempt.startup_seconds,
                     raw_share(attempt))
            self.facts[(attempt.subtask, attempt.number)] = known
        return known


def compute_baseline(
    parallelism: int,
    finished: list[Attempt],
    *,
    ratio: float,
    multiplier: float,
    lower_bound: float | None,
    input_bytes: dict[int, int] | None = None,
    normalize_by_input_bytes: bool = True,
    early: bool = True,
    facts: FinishedFacts | None = None,
) -> Baseline | None:
    """Return the baseline once N·R subtasks have finished (or, ``early``, once one has), else None.

    ``finished`` holds one finished attempt per finished subtask. The baseline uses the earliest
    N·R of them by finish time: T = median execution time, baseline = max(T·M, B). Before N·R finished,
    all finished ones count with M = max(M, :data:`EARLY_MULTIPLIER`). When every one of those has
    known input bytes, the median seconds per byte (times M) is kept too, so a subtask that is slow
    only because its split is larger is not called slow (see :meth:`Baseline.threshold`). B is
    ``lower_bound``, or derived from start-up times when it is None (:func:`derived_floor`).
    """
    needed = required_finished(parallelism, ratio)
    if len(finished) >= needed:
        source, count, factor = "run", needed, multiplier
    elif early and finished and parallelism > 1:
        source, count, factor = "early", len(finished), max(multiplier, EARLY_MULTIPLIER)
    else:
        return None
    known = facts if facts is not None else FinishedFacts()
    rows = [known.of(a) for a in finished]
    earliest = sorted(rows, key=itemgetter(1))[:count]
    times = [row[2] for row in earliest]
    floor, floor_source, startup = _floor([row[3] for row in rows], lower_bound)
    seconds = max(median(times) * factor, floor)
    per_byte = None
    if normalize_by_input_bytes and input_bytes:
        sizes = [input_bytes.get(row[0].subtask) or row[0].input_bytes or 0 for row in earliest]
        if all(size > 0 for size in sizes):
            per_byte = median(t / s for t, s in zip(times, sizes, strict=True)) * factor
    ratios = [r for r in (row[4] for row in rows) if r]
    return Baseline(seconds=seconds, per_byte=per_byte, source=source, floor=floor, floor_source=floor_source,
                    startup=startup, finished=count, factor=factor, read_ratio=median(ratios) if ratios else None)


def raw_share(attempt: Attempt) -> float | None:
    """Bytes an attempt reported read (Spark's input metrics) over its planned input bytes, None if unknown."""
    progress = attempt.progress or {}
    read, total = progress.get("bytes_read"), progress.get("input_bytes") or attempt.input_bytes
    if not read or not total:
        return None
    return float(read) / float(total)


def progress_share(attempt: Attempt, read_ratio: float | None) -> float | None:
    """The share of its work a running attempt has done, calibrated by what finished attempts read in all."""
    share = raw_share(attempt)
    if share is None or not read_ratio:
        return None
    return min(1.0, share / read_ratio)


def find_slow(
    attempts: list[Attempt],
    baseline: Baseline | None,
    now: float,
    input_bytes: dict[int, int] | None = None,
) -> list[Attempt]:
    """Return executing (not finished) attempts whose execution time is at or over the baseline.

    An attempt that reports progress is judged on its projected time (``elapsed / share``) once it has
    run past the floor, if a fresh copy (start-up plus the expected time) would still end first.
    """
    return [a for a, _ in judge_slow(attempts, baseline, now, input_bytes)]


def judge_slow(
    attempts: list[Attempt],
    baseline: Baseline | None,
    now: float,
    input_bytes: dict[int, int] | None = None,
) -> list[tuple[Attempt, str]]:
    """Like :func:`find_slow`, with the reason each attempt is slow (for the journal and the UI)."""
    if baseline is None:
        return []
    slow = []
    for attempt in attempts:
        if attempt.state not in (AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING):
            continue
        size = (input_bytes or {}).get(attempt.subtask) or attempt.input_bytes
        threshold = baseline.threshold(size)
        elapsed = attempt.execution_time(now)
        if elapsed >= threshold:
            slow.append((attempt, f"ran {elapsed:.1f}s >= {threshold:.1f}s ({baseline.source} baseline)"))
            continue
        if elapsed < baseline.floor:
            continue
        share = progress_share(attempt, baseline.read_ratio)
        if share is None or share < MIN_PROGRESS:
            continue
        projected = elapsed / share
        # The time a copy started now needs: its start-up and the work the baseline expects of it.
        copy = (baseline.startup or 0.0) + threshold / max(1.0, baseline.factor)
        if projected >= threshold and projected - elapsed > copy:
            slow.append((attempt, f"projected {projected:.1f}s from {share:.0%} read in {elapsed:.1f}s; "
                                  f"a copy needs ~{copy:.1f}s"))
    return slow
