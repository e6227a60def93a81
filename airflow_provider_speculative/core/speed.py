"""Speed-aware placement: how much slower each target runs this stage's work, and whether to wait for a faster one.

Spark's pull scheduling gives a slow executor fewer tasks without knowing it is slow: it asks for work
less often. This provider pushes attempts to targets, so it must know. A target's *slowness* is its
median execution time per input byte over the fastest target's (1.0 = as fast as the fastest):

- from this stage run: finished attempts per target, and running or cancelled ones as a lower bound (an
  attempt that has run for ``e`` seconds takes at least ``e``, so a target whose first wave overruns
  every finished attempt elsewhere is known to be slow before its attempts end, and a slow node whose
  attempts all lost to copies is still measured);
- before that, from **history**: the slowness each target showed in earlier stage runs on the same store
  (``store/speeds.py``), so the first wave of a daily run already avoids yesterday's slow node. What
  this run measures replaces history target by target;
- where history is missing, stale or says slow, from a **speed check** of the Spark Connect targets when
  the stage starts (``control/speedcheck.py``): one tiny query on each server at once, timed. A check's
  ratio is a server's overall slowness (CPU, a crowded host), not the stage's work; it only decides the
  first wave and is replaced by what the run measures.

Placement uses it three times (``core/scheduler.py``): among free targets it prefers one that is not
slow; a slow target runs one original at a time while a faster one is usable; and it *holds* an original
attempt back from a slow free target when waiting for a slot on a faster one ends sooner: the held
subtask's finish on the faster target is simulated from that target's slots (its running attempts'
remaining time, then one expected duration per subtask queued before it). Targets whose slowness differs
by less than :data:`SLOW_FACTOR` count as equal, so equal targets are filled in turn and none is
starved; nothing is held when one of the faster target's running attempts has outlived its expected time
by that factor (its end is not predictable any more), so a hold ends at the latest when the faster
target's attempts end or overrun.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from statistics import median

from airflow_provider_speculative.core.states import EXECUTING, TERMINAL, Attempt, AttemptState

# A target at least this much slower than the fastest is slow; below it differences are noise.
SLOW_FACTOR = 1.5
# Held only if waiting ends at least this share of the slow target's expected time sooner.
HOLD_MARGIN = 0.2
# Where a slowness came from when only unfinished attempts bound it from below (nothing finished there).
UNFINISHED = "run (unfinished attempts)"
# Slowness is capped: a throttled or swapping node can look arbitrarily slow, and the factor feeds a
# simulation whose queue length grows with it.
MAX_SLOWNESS = 64.0
# A speed check's ratio under this is noise: on this 2-core host, in 20 checks of two idle servers
# during benchmark runs the ratio was at most 1.63 (median 1.18), while a server throttled to 1/4 or
# 1/8 core had not answered by 2x in 32 of 32 (alone on the host: 2.9-6.2x). Measured with the
# 30M-row query of backends/spark_connect.py; the 10M-row one missed 4 of 40 (1.66x to 1.97x).
CHECK_SLOW_FACTOR = 2.0
# A check stops waiting once this many times the fastest server's check has passed: a server still
# running its check then is slow, which is all placement needs to know (it runs one attempt at a time).
CHECK_WAIT_FACTOR = CHECK_SLOW_FACTOR


@dataclass(frozen=True)
class Speeds:
    """Slowness by target (1.0 = the fastest), where each came from, and this run's seconds per byte."""

    slowness: Mapping[str, float]
    source: Mapping[str, str]
    # Median execution seconds per input byte on the fastest target in this run; None before one finished.
    fastest_per_byte: float | None = None

    def of(self, target: str) -> float:
        """The target's slowness; 1.0 (as fast as any) when nothing is known of it."""
        return self.slowness.get(target, 1.0)

    def is_slow(self, target: str) -> bool:
        """Clearly slower than the fastest target (not noise)."""
        return self.of(target) >= SLOW_FACTOR

    def bounded(self, target: str) -> bool:
        """True if the target's slowness is only a lower bound: unfinished attempts set it, nothing finished there."""
        return self.source.get(target) == UNFINISHED

    @functools.cached_property
    def slow_targets(self) -> frozenset[str]:
        """Every target :meth:`is_slow` calls slow (computed once: a Speeds is never changed)."""
        return frozenset(t for t, factor in self.slowness.items() if factor >= SLOW_FACTOR)


def _per_byte(attempt: Attempt, input_bytes: Mapping[int, int], now: float) -> float | None:
    size = input_bytes.get(attempt.subtask) or attempt.input_bytes or 0
    if size <= 0 or attempt.deploying_at is None or attempt.shared:
        return None
    if attempt.state == AttemptState.CANCELED:
        # A loser cancelled after running e seconds needed at least e: the slow node's usual fate.
        if attempt.end_at is None:
            return None
        return max(0.0, attempt.end_at - attempt.deploying_at - attempt.input_wait) / size
    return attempt.execution_time(now) / size


def observe(attempts: Iterable[Attempt], input_bytes: Mapping[int, int], now: float,
            history: Mapping[str, float] | None = None, history_source: Mapping[str, str] | None = None) -> Speeds:
    """Slowness per target from this run's attempts, falling back to ``history`` for targets not measured.

    ``history_source`` names where a history value came from (default ``history``; ``speed check``).

    One pass over the attempts: O(attempts). A stage that observes every step keeps a :class:`SpeedView`.
    """
    finished: dict[str, list[float]] = {}
    running: dict[str, float] = {}
    for attempt in attempts:
        rate = _per_byte(attempt, input_bytes, now)
        if rate is None:
            continue
        if attempt.state == AttemptState.FINISHED:
            finished.setdefault(attempt.target, []).append(rate)
        elif attempt.state in EXECUTING or attempt.state == AttemptState.CANCELED:
            running[attempt.target] = max(running.get(attempt.target, 0.0), rate)
    measured = {target: median(rates) for target, rates in finished.items()}
    return _speeds(measured, running, history, history_source)


def _speeds(measured: Mapping[str, float], running: Mapping[str, float], history: Mapping[str, float] | None,
            history_source: Mapping[str, str] | None) -> Speeds:
    """Slowness from each target's median finished rate and its largest unfinished one (what observe gathers)."""
    slowness: dict[str, float] = {}
    source: dict[str, str] = {}
    fastest = min(measured.values()) if measured else None
    if fastest:
        for target, rate in measured.items():
            # A running attempt that already took longer per byte than this target's finished ones did.
            slowness[target] = min(MAX_SLOWNESS, max(rate, running.get(target, 0.0)) / fastest)
            source[target] = "run"
        for target, rate in running.items():
            remembered = (history or {}).get(target, 0.0)
            # Unfinished attempts only bound the slowness from below: history stays while it says more.
            if target not in measured and rate > fastest and rate / fastest > remembered:
                slowness[target] = min(MAX_SLOWNESS, rate / fastest)
                source[target] = UNFINISHED
    for target, factor in (history or {}).items():
        if target not in slowness and factor > 0:
            slowness[target] = min(MAX_SLOWNESS, max(1.0, factor))
            source[target] = (history_source or {}).get(target, "history")
    return Speeds(slowness=slowness, source=source, fastest_per_byte=fastest)


def sorted_median(ordered: list[float]) -> float:
    """``statistics.median`` of a list already sorted (the same element, or the same mean of two)."""
    n = len(ordered)
    if n % 2 == 1:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


class SpeedView:
    """What :func:`observe` reads of a stage's attempts, kept per target and updated by subtask.

    Observing every attempt each placement round made a 10,000-subtask stage's step O(attempts). Here a
    finished or cancelled attempt's rate is stored once, in a sorted list per target (its median and maximum
    are then O(1)), and only the executing attempts, which hold slots and so are few, are timed again per
    round. :meth:`update` is told each subtask whose attempts changed; :meth:`speeds` equals ``observe`` over
    every attempt, value for value.
    """

    def __init__(self, input_bytes: Mapping[int, int]) -> None:
        self.input_bytes = input_bytes
        # subtask -> what each of its attempts contributes now: (target, kind, rate or None, attempt).
        self._of: dict[int, list[tuple[str, str, float | None, Attempt]]] = {}
        self._finished: dict[str, list[float]] = {}
        self._medians: dict[str, float] = {}
        self._cancelled: dict[str, list[float]] = {}
        # target -> (subtask, number) -> (deploying_at, input_wait, waiting_since, size) of its executing attempts.
        self._executing: dict[str, dict[tuple[int, int], tuple[float, float, float | None, int]]] = {}
        self._live: dict[tuple[int, int], Attempt] = {}
        self._live_on: dict[str, dict[tuple[int, int], Attempt]] = {}
        # target -> executing attempts without an input size (not timed here), and the longest execution time
        # of each target's timed executing attempts when speeds were last computed (at _longest_at).
        self._untimed: dict[str, int] = {}
        self._longest: dict[str, float] = {}
        self._longest_at: float | None = None
        self._per_target: dict[str, int] = {}
        # The last answer and what it was computed from: a controller step often ticks twice at one clock.
        self._last: tuple[float, dict[str, float], dict[str, str], Speeds] | None = None

    def update(self, subtask: int, attempts: Iterable[Attempt]) -> None:
        """Forget what was known of ``subtask``'s attempts and record ``attempts``, its attempts now."""
        self._last = None
        for target, kind, rate, attempt in self._of.pop(subtask, ()):
            self._drop(target, kind, rate, attempt)
        added = [self._add(attempt) for attempt in attempts]
        if added:
            self._of[subtask] = added

    def _add(self, attempt: Attempt) -> tuple[str, str, float | None, Attempt]:
        target = attempt.target
        self._per_target[target] = self._per_target.get(target, 0) + 1
        if attempt.state not in TERMINAL:
            self._live[(attempt.subtask, attempt.number)] = attempt
            self._live_on.setdefault(target, {})[(attempt.subtask, attempt.number)] = attempt
        # A shared attempt is not timed (_per_byte): its time is the target's load, not its speed.
        size = 0 if attempt.shared else self.input_bytes.get(attempt.subtask) or attempt.input_bytes or 0
        kind, rate = "", None
        if size > 0 and attempt.deploying_at is not None:
            if attempt.state == AttemptState.FINISHED:
                kind, rate = "finished", attempt.execution_time(0.0) / size
                bisect.insort(self._finished.setdefault(target, []), rate)
                self._medians[target] = sorted_median(self._finished[target])
            elif attempt.state == AttemptState.CANCELED and attempt.end_at is not None:
                kind = "cancelled"
                rate = max(0.0, attempt.end_at - attempt.deploying_at - attempt.input_wait) / size
                bisect.insort(self._cancelled.setdefault(target, []), rate)
            elif attempt.state in EXECUTING:
                kind = "executing"
                self._executing.setdefault(target, {})[(attempt.subtask, attempt.number)] = (
                    attempt.deploying_at, attempt.input_wait, attempt.waiting_since, size)
                self._longest_at = None
        elif attempt.state in EXECUTING and attempt.deploying_at is not None:
            kind = "untimed"
            self._untimed[target] = self._untimed.get(target, 0) + 1
        return target, kind, rate, attempt

    def _drop(self, target: str, kind: str, rate: float | None, attempt: Attempt) -> None:
        key = (attempt.subtask, attempt.number)
        self._per_target[target] -= 1
        if not self._per_target[target]:
            del self._per_target[target]
        if self._live.get(key) is attempt:
            del self._live[key]
            on = self._live_on[target]
            del on[key]
            if not on:
                del self._live_on[target]
        if kind == "finished" and rate is not None:
            rates = self._finished[target]
            del rates[bisect.bisect_left(rates, rate)]
            if rates:
                self._medians[target] = sorted_median(rates)
            else:
                del self._finished[target], self._medians[target]
        elif kind == "cancelled" and rate is not None:
            rates = self._cancelled[target]
            del rates[bisect.bisect_left(rates, rate)]
            if not rates:
                del self._cancelled[target]
        elif kind == "executing":
            running = self._executing[target]
            del running[key]
            if not running:
                del self._executing[target]
        elif kind == "untimed":
            self._untimed[target] -= 1
            if not self._untimed[target]:
                del self._untimed[target]

    def speeds(self, now: float, history: Mapping[str, float] | None = None,
               history_source: Mapping[str, str] | None = None) -> Speeds:
        """``observe`` of every attempt recorded, at ``now``: O(targets + executing attempts)."""
        history, history_source = history or {}, history_source or {}
        last = self._last
        if last is not None and last[0] == now and last[1] == history and last[2] == history_source:
            return last[3]
        running = {target: rates[-1] for target, rates in self._cancelled.items()}
        longest: dict[str, float] = {}
        for target, executing in self._executing.items():
            # A finished attempt's execution time does not depend on now; an executing one's does.
            rate = running.get(target, 0.0)
            ran = 0.0
            for deploying_at, input_wait, waiting_since, size in executing.values():
                # Attempt.execution_time of an executing attempt, inlined: the same operations, so the same value.
                waited = input_wait + (max(0.0, now - waiting_since) if waiting_since is not None else 0.0)
                elapsed = max(0.0, now - deploying_at - waited)
                rate = max(rate, elapsed / size)
                ran = max(ran, elapsed)
            running[target] = rate
            longest[target] = ran
        self._longest, self._longest_at = longest, now
        speeds = _speeds(self._medians, running, history, history_source)
        self._last = (now, dict(history), dict(history_source), speeds)
        return speeds

    def live(self) -> list[Attempt]:
        """The recorded attempts that are not FINISHED, FAILED or CANCELED."""
        return list(self._live.values())

    def live_on(self, target: str) -> list[Attempt]:
        """The recorded attempts on ``target`` that are not FINISHED, FAILED or CANCELED."""
        on = self._live_on.get(target)
        return list(on.values()) if on else []

    def targets(self) -> set[str]:
        """Targets any recorded attempt went to."""
        return set(self._per_target)

    def longest(self, target: str, now: float) -> float | None:
        """The longest execution time at ``now`` of ``target``'s live attempts; None if not known here.

        Known once :meth:`speeds` ran at ``now`` and no executing attempt was recorded since, unless one of the
        target's executing attempts has no input size (it is not timed here).
        """
        if self._longest_at != now or target in self._untimed:
            return None
        return self._longest.get(target, 0.0)

    def went_to(self, target: str) -> bool:
        """True if any recorded attempt went to ``target``."""
        return target in self._per_target


def check_slowness(durations: Mapping[str, float | None], elapsed: float,
                   fastest_total: float | None = None) -> dict[str, float]:
    """Slowness per target from one speed check; {} unless one finished and two were checked.

    ``durations``: seconds each target's check query took, None for one still running after
    ``elapsed`` seconds. A running one is at least ``elapsed`` over the fastest target's whole check
    (``fastest_total``, its session's set-up included; default: its query). Ratios under
    :data:`CHECK_SLOW_FACTOR` are noise and count as 1.0.
    """
    finished = [d for d in durations.values() if d is not None and d > 0]
    if not finished or len(durations) < 2:
        return {}
    fastest = min(finished)
    whole = max(fastest_total or fastest, fastest)
    out: dict[str, float] = {}
    for target, seconds in durations.items():
        ratio = seconds / fastest if seconds is not None else max(elapsed, whole) / whole
        out[target] = min(MAX_SLOWNESS, ratio) if ratio >= CHECK_SLOW_FACTOR else 1.0
    return out


def check_wanted(targets: Iterable[str], history: Mapping[str, float], ages: Mapping[str, float],
                 measured_this_run: Iterable[str], max_age: float) -> bool:
    """Whether a stage run should check its Connect targets' speed before its first wave.

    Yes when two or more targets are checkable and one of them has no record from this DAG run and its
    record is missing, older than ``max_age`` or slow (a slow node is re-checked rather than given a
    probe original); ``max_age`` 0 turns checks off.
    """
    names = list(targets)
    if max_age <= 0 or len(names) < 2:
        return False
    measured = set(measured_this_run)
    return any(t not in measured and (t not in history or ages.get(t, float("inf")) > max_age
                                      or history[t] >= SLOW_FACTOR) for t in names)


def probe_candidates(history: Mapping[str, float], measured_this_run: Iterable[str]) -> list[str]:
    """Targets an earlier DAG run found slow and no stage of this run measured yet: each deserves one probe."""
    measured = set(measured_this_run)
    return sorted(t for t, factor in history.items() if factor >= SLOW_FACTOR and t not in measured)


def run_slowness(attempts: Iterable[Attempt], input_bytes: Mapping[int, int]) -> dict[str, float]:
    """What a completed stage run measured of its targets (history keeps it); {} if under two targets.

    Finished attempts give a target's slowness; cancelled losers a lower bound (a slow node's attempts
    are usually overtaken by copies and never finish).
    """
    done = [a for a in attempts if a.state in (AttemptState.FINISHED, AttemptState.CANCELED)]
    speeds = observe(done, input_bytes, 0.0)
    measured = {t: f for t, f in speeds.slowness.items() if speeds.source.get(t, "").startswith("run")}
    return measured if len(measured) >= 2 else {}


def median_size(input_bytes: Mapping[int, int]) -> float | None:
    """The median input size of the subtasks that report one (a hold planner's unit of work), or None."""
    sizes = [s for s in input_bytes.values() if s > 0]
    return median(sizes) if sizes else None


@dataclass
class HoldPlanner:
    """Decides, within one placement round, whether an original should wait for a faster target.

    ``queues`` holds per target a heap of when each of its slots frees, in seconds from now (or in
    units of one expected duration before any attempt finished); every subtask held for a target takes
    that target's earliest slot and pushes back its own expected end, so later subtasks see a longer queue.
    A target's heap is built the first time it is asked for (:meth:`queue`), so a round that asks about a few
    targets does not read every live attempt.
    """

    speeds: Speeds
    # Expected duration on a target of slowness 1.0, in seconds (None: unknown, durations in units).
    unit: float | None
    queues: dict[str, list[float]]
    now: float = 0.0
    # A target's slot count (None: not a target of this stage, no queue) and its live attempts, for queues
    # not built yet.
    slot_count: Callable[[str], int | None] | None = None
    live_on: Callable[[str], Iterable[Attempt]] | None = None
    # The longest execution time of a target's live attempts, None if unknown (then only its queue tells).
    longest: Callable[[str], float | None] | None = None

    @classmethod
    def build(cls, speeds: Speeds, live: Iterable[Attempt], slots: Mapping[str, int],
              input_bytes: Mapping[int, int], now: float) -> HoldPlanner:
        """Queues of each target's slots from this stage's live attempts (others' attempts: a full duration)."""
        on: dict[str, list[Attempt]] = {}
        for attempt in live:
            on.setdefault(attempt.target, []).append(attempt)
        return cls.lazy(speeds, median_size(input_bytes), slots.get, lambda target: on.get(target, ()), now)

    @classmethod
    def lazy(cls, speeds: Speeds, size: float | None, slot_count: Callable[[str], int | None],
             live_on: Callable[[str], Iterable[Attempt]], now: float,
             longest: Callable[[str], float | None] | None = None) -> HoldPlanner:
        """A planner whose queues come from ``slot_count`` and ``live_on`` when first asked for.

        ``size`` is the median input size (:func:`median_size`); ``live_on`` must not change while the
        planner is in use (a caller launching attempts leaves them out).
        """
        per_byte = speeds.fastest_per_byte
        unit = per_byte * size if per_byte is not None and size is not None else None
        return cls(speeds=speeds, unit=unit, queues={}, now=now, slot_count=slot_count, live_on=live_on,
                   longest=longest)

    def sure_slots(self, target: str) -> int:
        """How many entries of ``target``'s queue, not built yet, surely free within one expected duration.

        Its slot count when none of its live attempts can be overdue (the longest has run less than
        SLOW_FACTOR expected durations), since every other entry is at most one expected duration; 0 when
        that is not known without building the queue.
        """
        if target in self.queues or self.slot_count is None:
            return 0
        count = self.slot_count(target) or 0
        if not count or self.unit is None:
            return count  # without a unit nothing is overdue and every entry is one expected duration
        expected = self.unit * self.speeds.of(target)
        longest = self.longest(target) if self.longest is not None else None
        if longest is None or expected <= 0 or longest >= expected * SLOW_FACTOR:
            return 0
        return count

    def queue(self, target: str) -> list[float] | None:
        """``target``'s heap of slot ends, built on first use; None if it is not a target with slots here."""
        queue = self.queues.get(target)
        if queue is not None or self.slot_count is None or self.live_on is None:
            return queue
        count = self.slot_count(target)
        if count is None:
            return None
        unit = self.unit
        # One expected duration on this target; its live attempts are all on it.
        expected = (unit if unit is not None else 1.0) * self.speeds.of(target)
        queue = []
        for attempt in self.live_on(target):
            elapsed = attempt.execution_time(self.now) if unit is not None else 0.0
            if unit is not None and elapsed >= expected * SLOW_FACTOR:
                # Clearly overdue: its end cannot be predicted, so nothing may be held for this target.
                queue = [float("inf")]
                break
            # Attempts started together end together, not all "now" when the first of them ends.
            queue.append(max(expected - elapsed, 0.1 * expected))
        if queue != [float("inf")]:
            queue.extend([expected] * max(0, count - len(queue)))  # slots held by other stages' attempts
            heapq.heapify(queue)
        self.queues[target] = queue
        return queue

    def hold_for(self, slow: str, candidates: Iterable[str]) -> tuple[str, float, float] | None:
        """The faster target to wait for instead of placing on ``slow`` now, and both expected finishes.

        Returns None to place now. Holding reserves the faster target's earliest slot for this subtask.
        """
        if not self.speeds.is_slow(slow):
            return None
        scale = self.unit if self.unit is not None else 1.0
        here = scale * self.speeds.of(slow)
        best: tuple[str, float] | None = None
        for target in candidates:
            queue = self.queue(target)
            if target == slow or not queue or queue[0] == float("inf"):
                continue
            if self.speeds.of(slow) < SLOW_FACTOR * self.speeds.of(target):
                continue
            finish = queue[0] + scale * self.speeds.of(target)
            if best is None or finish < best[1]:
                best = (target, finish)
        if best is None or best[1] > here * (1.0 - HOLD_MARGIN):
            return None
        target, finish = best
        heapq.heapreplace(self.queues[target], finish)
        return target, finish, here
