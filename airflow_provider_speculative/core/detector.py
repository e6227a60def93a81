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

And one to the per-byte normalisation: it raises a large split's threshold because its time is
explained by its size. On a target that placement knows is slow (``core/speed.py``: at least
``SLOW_FACTOR`` slower than the fastest, from this run, history or a speed check) the target explains
the time, so an attempt there is held to the plain baseline, whatever its size. Otherwise the largest
split on a slow node waits ``M`` times its own expected time before a copy starts, and the copy then
needs that whole expected time again: the stage's last attempt.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from statistics import median

from airflow_provider_speculative.core.speed import sorted_median
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


class BaselineView:
    """:func:`compute_baseline` over a stage's admitted attempts, kept sorted between admissions.

    Recomputing the baseline from every finished attempt at each step that admits one made a 10,000-subtask
    stage O(subtasks) per step (O(subtasks²) in all). Here each admitted subtask's facts are inserted once
    into sorted lists: all rows by (end, subtask), the execution times and seconds per byte of the earliest
    rows the baseline uses, all start-up times and all read shares; a median is then an index. Only the
    subtasks :meth:`update` is told of are looked at again; :meth:`baseline` equals ``compute_baseline``.
    """

    def __init__(self, input_bytes: dict[int, int]) -> None:
        self.input_bytes = input_bytes
        self._rows: dict[int, _Facts] = {}
        self._order: list[tuple[float, int]] = []
        self._startups: list[float] = []
        self._ratios: list[float] = []
        # The rows of _order[:_prefix] are in these: the earliest rows, the ones the baseline reads.
        self._prefix = 0
        self._times: list[float] = []
        self._per_byte: list[float] = []
        self._unsized = 0

    def update(self, subtask: int, attempt: Attempt | None) -> None:
        """``subtask``'s admitted attempt now (None: not admitted, or not started): its row is replaced."""
        old = self._rows.pop(subtask, None)
        if old is not None:
            position = bisect.bisect_left(self._order, old[1])
            del self._order[position]
            if position < self._prefix:
                self._prefix -= 1
                self._earliest(old, add=False)
            _remove(self._startups, old[3])
            _remove(self._ratios, old[4] or None)
        if attempt is None:
            return
        end = attempt.end_at or 0.0
        row = (attempt, (end, attempt.subtask), attempt.execution_time(end), attempt.startup_seconds,
               raw_share(attempt))
        self._rows[subtask] = row
        position = bisect.bisect_left(self._order, row[1])
        self._order.insert(position, row[1])
        if position < self._prefix:
            self._prefix += 1
            self._earliest(row, add=True)
        if row[3] is not None:
            bisect.insort(self._startups, row[3])
        if row[4]:
            bisect.insort(self._ratios, row[4])

    def _earliest(self, row: _Facts, add: bool) -> None:
        """Add ``row`` to (or remove it from) the earliest rows' sorted times and seconds per byte."""
        attempt = row[0]
        size = self.input_bytes.get(attempt.subtask) or attempt.input_bytes or 0
        change = bisect.insort if add else _remove
        change(self._times, row[2])
        if size > 0:
            change(self._per_byte, row[2] / size)
        else:
            self._unsized += 1 if add else -1

    def baseline(self, parallelism: int, *, ratio: float, multiplier: float, lower_bound: float | None,
                 normalize_by_input_bytes: bool = True, early: bool = True) -> Baseline | None:
        """``compute_baseline`` of the rows recorded, with the same options: O(rows that moved in or out)."""
        finished = len(self._rows)
        needed = required_finished(parallelism, ratio)
        if finished >= needed:
            source, count, factor = "run", needed, multiplier
        elif early and finished and parallelism > 1:
            source, count, factor = "early", finished, max(multiplier, EARLY_MULTIPLIER)
        else:
            return None
        while self._prefix < count:
            self._earliest(self._rows[self._order[self._prefix][1]], add=True)
            self._prefix += 1
        while self._prefix > count:
            self._prefix -= 1
            self._earliest(self._rows[self._order[self._prefix][1]], add=False)
        startup = sorted_median(self._startups) if self._startups else None
        if lower_bound is not None:
            floor, floor_source = lower_bound, "configured"
        else:
            floor, floor_source = max(MIN_FLOOR, 2.0 * (startup or 0.0)), "startup"
        seconds = max(sorted_median(self._times) * factor, floor)
        per_byte = None
        if normalize_by_input_bytes and self.input_bytes and not self._unsized:
            per_byte = sorted_median(self._per_byte) * factor
        return Baseline(seconds=seconds, per_byte=per_byte, source=source, floor=floor, floor_source=floor_source,
                        startup=startup, finished=count, factor=factor,
                        read_ratio=sorted_median(self._ratios) if self._ratios else None)


def _remove(ordered: list[float], value: float | None) -> None:
    """Remove one ``value`` from a sorted list (nothing for None)."""
    if value is not None:
        del ordered[bisect.bisect_left(ordered, value)]


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
    slow_targets: Collection[str] = frozenset(),
) -> list[Attempt]:
    """Return executing (not finished) attempts whose execution time is at or over the baseline.

    An attempt that reports progress is judged on its projected time (``elapsed / share``) once it has
    run past the floor, if a fresh copy (start-up plus the expected time) would still end first. An
    attempt on one of ``slow_targets`` is held to the plain baseline (no per-byte raise).
    """
    return [a for a, _ in judge_slow(attempts, baseline, now, input_bytes, slow_targets)]


def judge_slow(
    attempts: list[Attempt],
    baseline: Baseline | None,
    now: float,
    input_bytes: dict[int, int] | None = None,
    slow_targets: Collection[str] = frozenset(),
) -> list[tuple[Attempt, str]]:
    """Like :func:`find_slow`, with the reason each attempt is slow (for the journal and the UI)."""
    if baseline is None:
        return []
    slow = []
    for attempt in attempts:
        why = judge_one(attempt, baseline, now, input_bytes, attempt.target in slow_targets)
        if why is not None:
            slow.append((attempt, why))
    return slow


def judge_one(attempt: Attempt, baseline: Baseline, now: float, input_bytes: dict[int, int] | None = None,
              slow_target: bool = False) -> str | None:
    """Why one attempt is slow now (:func:`judge_slow`'s rule), or None if it is not.

    ``slow_target``: the attempt's target is known to be slow, so its size does not raise its threshold.
    """
    if attempt.state not in _EXECUTING:
        return None
    size = (input_bytes or {}).get(attempt.subtask) or attempt.input_bytes
    sized = baseline.threshold(size)
    threshold = baseline.seconds if slow_target else sized
    elapsed = attempt.execution_time(now)
    if elapsed >= threshold:
        plain = "; its target is slow, so not per byte" if threshold < sized else ""
        return f"ran {elapsed:.1f}s >= {threshold:.1f}s ({baseline.source} baseline{plain})"
    if elapsed < baseline.floor:
        return None
    share = progress_share(attempt, baseline.read_ratio)
    if share is None or share < MIN_PROGRESS:
        return None
    projected = elapsed / share
    # The time a copy started now needs: its start-up and the work the baseline expects of a split this size.
    copy = (baseline.startup or 0.0) + sized / max(1.0, baseline.factor)
    if projected >= threshold and projected - elapsed > copy:
        return f"projected {projected:.1f}s from {share:.0%} read in {elapsed:.1f}s; a copy needs ~{copy:.1f}s"
    return None


_EXECUTING = frozenset({AttemptState.DEPLOYING, AttemptState.INITIALIZING, AttemptState.RUNNING})
# Relative slack on the clock when deciding an attempt cannot have run long enough yet: far above float
# rounding of epoch seconds (1e-16 relative), far below any threshold that matters.
_SLACK = 1e-9
# SlowWatch orders waiting attempts by bounds this share under the baseline's seconds, seconds per byte and
# read ratio, and orders them again only when the baseline leaves that margin (a few times per stage).
_MARGIN = 0.1

# One watched attempt: the attempt, its place among its subtask's attempts, deploying_at + input_wait
# (None: not known, judged every step), its input bytes, and the share of them it reported read (or None).
_Watched = tuple[Attempt, int, float | None, int, float | None]


class SlowWatch:
    """:func:`judge_slow` over a stage's candidate attempts, without judging every one of them each step.

    An attempt's execution time is at most ``now - start`` (``start`` = deploying_at + input_wait). Unless
    its progress can be projected it can be slow only once that reaches its threshold, at least
    ``max(seconds, per_byte * size)`` of the baseline; with progress, once it reaches the floor (the
    projection needs no more). Progress is projected from a reported share of at least MIN_PROGRESS times
    the baseline's read ratio, so that ratio is bounded too. So attempts wait in heaps by the time they
    could first be slow, computed from bounds a margin under the baseline's (the heaps are rebuilt only
    when the baseline leaves that margin), and only those past it are judged, with :func:`judge_one`
    itself, every step. :meth:`update` is told each subtask whose attempts changed, or that stopped being
    a candidate. Attempts on a slow target (held to the plain baseline, see :func:`judge_one`) are judged
    every step from the moment their target is called slow: their number is bounded by those targets' slots.
    """

    def __init__(self, input_bytes: dict[int, int] | None = None) -> None:
        self.input_bytes = input_bytes
        self._entries: dict[tuple[int, int], _Watched] = {}
        self._numbers: dict[int, list[int]] = {}
        # (when it could first be slow, push order, key, attempt): without progress, by its threshold's
        # bound; with progress, by its start (judged once it has run the floor).
        self._plain: list[tuple[float, int, tuple[int, int], Attempt]] = []
        self._reporting: list[tuple[float, int, tuple[int, int], Attempt]] = []
        self._pushed = 0
        # Lower bounds of the baseline's seconds, seconds per byte and read ratio (None: no projection) that
        # the heaps are ordered by.
        self._bounds: tuple[float, float, float | None] = (0.0, 0.0, None)
        self._judged: dict[tuple[int, int], _Watched] = {}
        # Each target's watched attempts, and the slow targets of the last judge call.
        self._on_target: dict[str, set[tuple[int, int]]] = {}
        self._slow_targets: frozenset[str] = frozenset()
        # The last answer, its baseline, clock and slow targets: a controller step often ticks twice at one clock.
        self._last: tuple[Baseline, float, frozenset[str], list[tuple[Attempt, str]]] | None = None

    def update(self, subtask: int, attempts: Iterable[Attempt]) -> None:
        """Replace ``subtask``'s candidates with its executing ``attempts`` (none once it is admitted)."""
        self._last = None
        for number in self._numbers.pop(subtask, ()):
            key = (subtask, number)
            target = self._entries.pop(key)[0].target
            self._judged.pop(key, None)
            keys = self._on_target[target]
            keys.discard(key)
            if not keys:
                del self._on_target[target]
        numbers = []
        for place, attempt in enumerate(attempts):
            if attempt.state not in _EXECUTING:
                continue
            key = (subtask, attempt.number)
            start = attempt.deploying_at + attempt.input_wait if attempt.deploying_at is not None else None
            size = (self.input_bytes or {}).get(subtask) or attempt.input_bytes or 0
            watched = (attempt, place, start, size, raw_share(attempt))
            self._entries[key] = watched
            self._on_target.setdefault(attempt.target, set()).add(key)
            numbers.append(attempt.number)
            self._wait(key, watched)
        if numbers:
            self._numbers[subtask] = numbers
        if len(self._plain) + len(self._reporting) > 2 * len(self._entries) + 64:
            self._rebuild(self._bounds)

    def _wait(self, key: tuple[int, int], watched: _Watched) -> None:
        """Queue an attempt by when it could first be slow (or judge it every step if that is unknown)."""
        attempt, _, start, size, share = watched
        if start is None or attempt.target in self._slow_targets:
            self._judged[key] = watched
            return
        self._pushed += 1
        seconds, per_byte, ratio = self._bounds
        if share is not None and ratio is not None and share / ratio >= MIN_PROGRESS * (1 - _SLACK):
            heapq.heappush(self._reporting, (start, self._pushed, key, attempt))
        else:
            heapq.heappush(self._plain, (start + max(seconds, per_byte * size), self._pushed, key, attempt))

    def _rebuild(self, bounds: tuple[float, float, float | None]) -> None:
        """Order every attempt by ``bounds`` again; those judged so far wait again too (judge pops them at once)."""
        self._bounds = bounds
        self._plain, self._reporting, self._judged = [], [], {}
        for key, watched in self._entries.items():
            self._wait(key, watched)

    def _current(self, entry: tuple[float, int, tuple[int, int], Attempt]) -> bool:
        known = self._entries.get(entry[2])
        return known is not None and known[0] is entry[3] and entry[2] not in self._judged

    def judge(self, baseline: Baseline | None, now: float, slow_targets: Collection[str] = frozenset()
              ) -> list[tuple[Attempt, str]]:
        """``judge_slow`` of every candidate (``slow_targets`` as there), in subtask and attempt order."""
        if baseline is None:
            return []
        slow_targets = frozenset(slow_targets)
        last = self._last
        if last is not None and last[0] is baseline and last[1] == now and last[2] == slow_targets:
            return list(last[3])
        if slow_targets != self._slow_targets:
            for target in slow_targets - self._slow_targets:
                for key in self._on_target.get(target, ()):
                    self._judged[key] = self._entries[key]
            # Attempts on a target no longer slow stay judged until the next rebuild: judging is exact anyway.
            self._slow_targets = slow_targets
        seconds, per_byte = baseline.seconds, baseline.per_byte if baseline.per_byte is not None else 0.0
        ratio = baseline.read_ratio or None
        low, high, least_ratio = self._bounds
        # Bounds over the baseline's, or so far under them that too many attempts would be judged: reorder.
        off = low > seconds or high > per_byte or (ratio is not None and (least_ratio is None or least_ratio > ratio))
        loose = (low < (1 - 2 * _MARGIN) * seconds or high < (1 - 2 * _MARGIN) * per_byte
                 or (ratio is not None and least_ratio is not None and least_ratio < (1 - 2 * _MARGIN) * ratio))
        if off or loose:
            self._rebuild(((1 - _MARGIN) * seconds, (1 - _MARGIN) * per_byte,
                           (1 - _MARGIN) * ratio if ratio is not None else None))
        slack = _SLACK * (abs(now) + abs(seconds) + 1.0)
        floor = min(seconds, baseline.floor)
        # Execution time is never negative: with a bound of 0 every attempt may be slow now.
        plain_until = now + slack if self._bounds[0] > 0 else math.inf
        reporting_until = now - floor + slack if floor > 0 else math.inf
        for heap, until in ((self._plain, plain_until), (self._reporting, reporting_until)):
            while heap and heap[0][0] <= until + _SLACK * abs(heap[0][0]):
                entry = heapq.heappop(heap)
                if self._current(entry):
                    self._judged[entry[2]] = self._entries[entry[2]]
        slow = []
        for key, (attempt, place, *_) in self._judged.items():
            why = judge_one(attempt, baseline, now, self.input_bytes, attempt.target in slow_targets)
            if why is not None:
                slow.append((key[0], place, attempt, why))
        slow.sort(key=itemgetter(0, 1))
        judged = [(attempt, why) for _, _, attempt, why in slow]
        self._last = (baseline, now, slow_targets, judged)
        return list(judged)
