"""Adaptive parallelism and byte-balanced exchange ranges (FLIP-187, Spark AQE). Pure: no I/O."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from airflow_provider_speculative.core.units import format_bytes

AUTO = "auto"


def decide_parallelism(*, total_bytes: int, per_subtask: int, minimum: int, maximum: int,
                       bounds: dict[str, int], files: int | None = None, slots: int | None = None) -> dict[str, Any]:
    """Subtasks for ``total_bytes`` at ``per_subtask`` bytes each, clamped to [minimum, maximum].

    ``bounds`` are further upper bounds by name (``files``: a subtask reads whole source files;
    ``subpartitions of X``: an all_to_all consumer reads at least one subpartition). They win over
    ``minimum``: a subtask with nothing to read is not worth launching. With ``slots`` (the attempts the
    stage's targets run at once) the count is then rounded to whole waves (``full_waves``).
    """
    wanted = max(1, math.ceil(total_bytes / per_subtask)) if per_subtask > 0 else 1
    chosen = min(max(wanted, minimum), maximum)
    bounded_by = "min_parallelism" if wanted < minimum else "max_parallelism" if wanted > maximum else "bytes"
    for name, bound in sorted(bounds.items()):
        if bound < chosen:
            chosen, bounded_by = max(1, bound), name
    decision: dict[str, Any] = {
        "mode": AUTO, "bytes": int(total_bytes), "per_subtask": int(per_subtask), "min": minimum, "max": maximum,
        "files": files, "wanted": wanted, "chosen": chosen, "bounded_by": bounded_by}
    if slots is not None and slots > 1:
        upper = min([maximum, *bounds.values()])
        waved = full_waves(chosen, slots, lower=min(minimum, chosen), upper=upper,
                           smallest=total_bytes / (per_subtask / 2) if per_subtask > 0 else None)
        decision["slots"] = slots
        if waved != chosen:
            decision.update(before_waves=chosen, chosen=waved, bounded_by=f"full waves of {slots} slots")
    return decision


def full_waves(chosen: int, slots: int, *, lower: int, upper: int, smallest: float | None = None) -> int:
    """``chosen`` rounded to a multiple of ``slots`` within [lower, upper], or ``chosen`` if none fits.

    A stage of 9 subtasks on 4 slots runs 3 waves, the last with one attempt and 3 idle slots; 8
    slightly larger subtasks run 2 full waves. Rounds to the nearer multiple (up on a tie); rounding
    up never makes more subtasks than ``smallest`` allows (a subtask keeps at least half the bytes
    it was sized for), and rounding down never drops below one wave.
    """
    rest = chosen % slots
    if rest == 0:
        return chosen
    down, up = chosen - rest, chosen + slots - rest
    down_ok = down >= max(lower, 1)
    up_ok = up <= upper and (smallest is None or up <= max(smallest, 1))
    if up_ok and (2 * rest >= slots or not down_ok):
        return up
    return down if down_ok else chosen


def balanced_ranges(sizes: list[int], n: int) -> list[tuple[int, int]]:
    """Split ``sizes`` into ``n`` contiguous, non-empty [start, stop) ranges of about equal sum.

    Each cut goes at the prefix sum nearest the ideal boundary of what is left (the remainder divided by
    the consumers left), so one oversized element takes a range of its own and the rest is shared out
    evenly around it. Deterministic (ties cut earlier); O(n log m). All-zero sizes: equal counts.
    """
    m = len(sizes)
    if not 1 <= n <= m:
        raise ValueError(f"cannot split {m} elements into {n} non-empty ranges")
    prefix = list(accumulate(sizes, initial=0))
    total = prefix[-1]
    if total <= 0:
        return [(i * m // n, (i + 1) * m // n) for i in range(n)]
    cuts = [0]
    for k in range(1, n):
        start = cuts[-1]
        goal = prefix[start] + (total - prefix[start]) / (n - k + 1)
        lo, hi = start + 1, m - (n - k)  # leave at least one element per later range
        p = min(max(bisect_left(prefix, goal, lo, hi + 1), lo), hi)
        if p > lo and goal - prefix[p - 1] <= prefix[p] - goal:
            p -= 1
        cuts.append(p)
    cuts.append(m)
    return [(cuts[i], cuts[i + 1]) for i in range(n)]


def equal_count_ranges(m: int, n: int) -> list[tuple[int, int]]:
    """The equal-count baseline: consumer i reads [i*m//n, (i+1)*m//n)."""
    return [(i * m // n, (i + 1) * m // n) for i in range(n)]


@dataclass
class ExchangeRanges:
    """What each consumer of an all_to_all exchange reads, plus the skew found on the way."""

    # Per consumer: ((producer lo, producer hi), (subpartition start, stop)).
    reads: list[tuple[tuple[int, int], tuple[int, int]]]
    skew: list[dict[str, Any]] = field(default_factory=list)


def exchange_ranges(per_producer: list[list[int]], n: int, *, balanced: bool = True,
                    splittable_skew: bool = False) -> ExchangeRanges:
    """Assign ``n`` consumers their reads of an all_to_all exchange.

    ``per_producer[p][sp]`` is producer p's bytes in subpartition sp. Balanced: contiguous subpartition
    ranges of about equal bytes; a subpartition holding more than one consumer's share is skew. With
    ``splittable_skew`` (the stage's logic merges partial results, e.g. an aggregation with a merge
    step) a skewed subpartition is split across consumers by producer ranges; otherwise it is reported.
    """
    producers = len(per_producer)
    m = len(per_producer[0]) if per_producer else 0
    per_sp = [sum(row[sp] for row in per_producer) for sp in range(m)]
    total = sum(per_sp)
    full = (0, producers)
    if not balanced:
        return ExchangeRanges([(full, r) for r in equal_count_ranges(m, n)])
    target = total / n if n else 0
    skewed = [sp for sp in range(m) if n > 1 and per_sp[sp] > target > 0]
    if splittable_skew and skewed:
        split = _split_skew(per_producer, per_sp, n, skewed)
        if split is not None:
            return split
    reads = [(full, r) for r in balanced_ranges(per_sp, n)]
    skew = [{"subpartition": sp, "bytes": per_sp[sp], "share": per_sp[sp] / total, "split": 1,
             "reason": "stage does not declare splittable_skew" if not splittable_skew
             else "too few consumers or producers to split it"} for sp in skewed]
    return ExchangeRanges(reads, skew)


def _split_skew(per_producer: list[list[int]], per_sp: list[int], n: int,
                skewed: list[int]) -> ExchangeRanges | None:
    """Units (runs of ordinary subpartitions, single skewed ones) get consumers by D'Hondt on bytes.

    A consumer reads one unit's share: a subpartition range from every producer, or one skewed
    subpartition from a producer range. Returns None if the units cannot take exactly ``n`` consumers.
    """
    producers, m, total = len(per_producer), len(per_sp), sum(per_sp)
    units: list[tuple[str, int, int]] = []  # (kind, start, stop)
    start = 0
    for sp in skewed:
        if start < sp:
            units.append(("run", start, sp))
        units.append(("skew", sp, sp + 1))
        start = sp + 1
    if start < m:
        units.append(("run", start, m))
    # Runs with no bytes have no files to read: nobody needs to read them.
    units = [u for u in units if sum(per_sp[u[1]:u[2]]) > 0]
    sizes = [sum(per_sp[a:b]) for _, a, b in units]
    caps = [b - a if kind == "run" else sum(1 for row in per_producer if row[a] > 0) for kind, a, b in units]
    if len(units) > n or sum(caps) < n:
        return None
    alloc = [1] * len(units)
    heap: list[tuple[float, int]] = [(-sizes[i], i) for i in range(len(units)) if caps[i] > 1]
    heapq.heapify(heap)
    for _ in range(n - len(units)):
        _, i = heapq.heappop(heap)
        alloc[i] += 1
        if alloc[i] < caps[i]:
            heapq.heappush(heap, (-sizes[i] / alloc[i], i))
    reads: list[tuple[tuple[int, int], tuple[int, int]]] = []
    skew: list[dict[str, Any]] = []
    for (kind, a, b), k in zip(units, alloc, strict=True):
        if kind == "run":
            reads += [((0, producers), (a + lo, a + hi)) for lo, hi in balanced_ranges(per_sp[a:b], k)]
        else:
            column = [row[a] for row in per_producer]
            reads += [((lo, hi), (a, b)) for lo, hi in balanced_ranges(column, k)]
            skew.append({"subpartition": a, "bytes": per_sp[a], "share": per_sp[a] / total, "split": k,
                         "reason": "split by producer range (splittable_skew)"})
    return ExchangeRanges(reads, skew)


def skew_message(entry: dict[str, Any]) -> str:
    """One line for plan warnings, the journal and ``airflow speculative status``."""
    head = f"subpartition {entry['subpartition']} holds {entry['share']:.0%} of the bytes"
    if entry["split"] > 1:
        return f"{head}; split across {entry['split']} consumers by producer range"
    return f"{head}; not split ({entry['reason']})"


def describe_decision(decision: dict[str, Any] | None) -> str:
    """One line on how a stage's parallelism was decided (status and stage view)."""
    if not decision or decision.get("mode") != AUTO:
        return "fixed" if decision else "fixed (plan predates adaptive parallelism)"
    bounds = f"within [{decision['min']}, {decision['max']}]"
    if decision.get("inherited_from"):
        sources = ", ".join(decision["inherited_from"])
        return f"auto: {decision['chosen']}, inherited through pointwise input from {sources}"
    files = f", {decision['files']} source files" if decision.get("files") is not None else ""
    waves = f", {decision['before_waves']} before rounding to waves" if "before_waves" in decision else ""
    return (f"auto: {format_bytes(decision['bytes'])} / {format_bytes(decision['per_subtask'])} per subtask -> "
            f"{decision['wanted']}, {bounds}{files}{waves}: {decision['chosen']} (bounded by "
            f"{decision['bounded_by']})")
