"""FLIP-168 execution-time slow-task detector, with optional time-per-input-byte normalisation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from airflow_provider_speculative.core.states import Attempt, AttemptState


@dataclass(frozen=True)
class Baseline:
    """A stage's slow-task baseline. ``per_byte`` is set when time is compared per input byte."""

    seconds: float
    per_byte: float | None = None

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


def compute_baseline(
    parallelism: int,
    finished: list[Attempt],
    *,
    ratio: float,
    multiplier: float,
    lower_bound: float,
    input_bytes: dict[int, int] | None = None,
    normalize_by_input_bytes: bool = True,
) -> Baseline | None:
    """Return the baseline once N·R subtasks have finished, else None.

    ``finished`` holds one finished attempt per finished subtask. The baseline uses the earliest
    N·R of them by finish time: T = median execution time, baseline = max(T·M, B). When every one of
    those has known input bytes, the median seconds per byte (times M) is kept too, so a subtask that
    is slow only because its split is larger is not called slow (see :meth:`Baseline.threshold`).
    """
    needed = required_finished(parallelism, ratio)
    if len(finished) < needed:
        return None
    earliest = sorted(finished, key=lambda a: (a.end_at or 0.0, a.subtask))[:needed]
    times = [a.execution_time(a.end_at or 0.0) for a in earliest]
    seconds = max(median(times) * multiplier, lower_bound)
    per_byte = None
    if normalize_by_input_bytes and input_bytes:
        sizes = [input_bytes.get(a.subtask) or a.input_bytes or 0 for a in earliest]
        if all(size > 0 for size in sizes):
            per_byte = median(t / s for t, s in zip(times, sizes, strict=True)) * multiplier
    return Baseline(seconds=seconds, per_byte=per_byte)


def find_slow(
    attempts: list[Attempt],
    baseline: Baseline | None,
    now: float,
    input_bytes: dict[int, int] | None = None,
) -> list[Attempt]:
    """Return executing (not finished) attempts whose execution time is at or over the baseline."""
    if baseline is None:
        return []
    slow = []
    for attempt in attempts:
        if attempt.state not in (AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING):
            continue
        size = (input_bytes or {}).get(attempt.subtask) or attempt.input_bytes
        if attempt.execution_time(now) >= baseline.threshold(size):
            slow.append(attempt)
    return slow
