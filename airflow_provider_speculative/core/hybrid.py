"""Hybrid exchanges (FLIP-235): which consumer subtasks may run on the producers' admitted partitions.

Pure rules, no I/O. A consumer of a hybrid exchange starts while its producer stage still runs and
reads only **admitted** producer attempts (the first finisher of each producer subtask), never a
running or losing one. The controller feeds what it reads from the producer's store to the
StageScheduler (``InputsAdmitted``, ``InputWithdrawn``); the scheduler asks these functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_speculative.core.states import NO_COMMIT_TASK_STATES


@dataclass(frozen=True)
class HybridEdge:
    """One hybrid input of a consumer stage: its producer and which producers each consumer subtask reads."""

    input: str
    upstream: str
    distribution: str  # "pointwise" | "all_to_all"
    producer_parallelism: int
    # Consumer subtask -> [lo, hi) of producer subtasks it reads (pointwise: [i, i + 1)).
    ranges: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    def producers(self, subtask: int) -> range:
        """The producer subtasks consumer ``subtask`` reads."""
        lo, hi = self.ranges[subtask]
        return range(lo, hi)


def hybrid_edges(plan: Mapping[str, Any]) -> dict[str, HybridEdge]:
    """The hybrid inputs of a planned stage, by input name (empty for a blocking-only stage)."""
    edges: dict[str, HybridEdge] = {}
    for name, entry in (plan.get("inputs") or {}).items():
        if entry.get("kind") != "exchange" or entry.get("mode") != "hybrid":
            continue
        ranges = tuple(tuple(s["inputs"][name]["producers"]) for s in plan["subtasks"])
        edges[name] = HybridEdge(name, entry["upstream"], entry["distribution"],
                                 int(entry["producer_parallelism"]), ranges)
    return edges


def required_admitted(edge: HybridEdge, subtask: int, share: float) -> int:
    """How many producers of ``subtask``'s range must be admitted before it may start.

    Pointwise: its one producer. All-to-all: ``share`` of its range (rounded up, at least one): the
    attempt then reads the rest incrementally as they are admitted.
    """
    count = len(edge.producers(subtask))
    if edge.distribution == "pointwise":
        return count
    return max(1, min(count, math.ceil(share * count - 1e-9)))


def admitted_in_range(edge: HybridEdge, subtask: int, admitted: Mapping[int, int]) -> int:
    """Producers of ``subtask``'s range with an admitted attempt (O(range) or O(admitted), whichever is less)."""
    lo, hi = edge.ranges[subtask]
    if hi - lo <= len(admitted):
        return sum(1 for p in range(lo, hi) if p in admitted)
    return sum(1 for p in admitted if lo <= p < hi)


def launchable(edges: Mapping[str, HybridEdge], subtask: int, admitted: Mapping[str, Mapping[int, int]],
               share: float, committed: Mapping[str, bool] | None = None) -> bool:
    """True if every hybrid input of consumer ``subtask`` has enough admitted producers to start it.

    A committed producer stage has every partition admitted for good: it gates nothing.
    """
    for edge in edges.values():
        if committed and committed.get(edge.upstream):
            continue
        if admitted_in_range(edge, subtask, admitted.get(edge.upstream, {})) < required_admitted(
                edge, subtask, share):
            return False
    return True


def waiting_for(edges: Mapping[str, HybridEdge], subtask: int, admitted: Mapping[str, Mapping[int, int]],
                committed: Mapping[str, bool] | None = None) -> str | None:
    """What consumer ``subtask`` waits for, in words ("producer partitions 3/8 admitted"); None if nothing."""
    parts = []
    for edge in edges.values():
        if committed and committed.get(edge.upstream):
            continue
        total = len(edge.producers(subtask))
        have = admitted_in_range(edge, subtask, admitted.get(edge.upstream, {}))
        if have < total:
            parts.append(f"input {edge.input!r}: producer partitions {have}/{total} admitted ({edge.upstream})")
    return "waiting for " + "; ".join(parts) if parts else None


def consumer_slots(free_slots: int, producers_waiting: int) -> int:
    """How many free slots a hybrid consumer may take: never those its own producers still need.

    FLIP-235's fallback to blocking when resources are short: ``producers_waiting`` producer subtasks
    of the same run have neither a live nor an admitted attempt and would want a slot, so that many
    free slots stay theirs. With shared slots per target across stages the same rule applies to the
    shared count.
    """
    return max(0, free_slots - max(0, producers_waiting))


def read_attempt(reads: Mapping[str, Any] | None, stage: str, producer: int) -> int | None:
    """The producer attempt a consumer attempt recorded reading (its heartbeat's ``reads``); None if not read."""
    if not reads:
        return None
    per_stage = reads.get(stage) or {}
    value = per_stage.get(str(producer), per_stage.get(producer)) if isinstance(per_stage, Mapping) else None
    return int(value) if value is not None else None


def restarts_on_withdrawal(attempt_reads: Mapping[tuple[int, int], Mapping[str, Any] | None], stage: str,
                           producer: int, withdrawn: int) -> list[tuple[int, int]]:
    """FLIP-1 with consumers in flight: the live consumer attempts that read the withdrawn producer attempt.

    ``attempt_reads`` maps (subtask, attempt) of each live consumer attempt to the reads it recorded.
    Exactly those restart; an attempt that read another attempt of that producer, or has not read it
    yet (it will read whatever is admitted then), keeps running.
    """
    return sorted(key for key, reads in attempt_reads.items() if read_attempt(reads, stage, producer) == withdrawn)


def producer_plan_usable(plan: Mapping[str, Any] | None, task: Mapping[str, Any] | None,
                         committed: Mapping[str, Any] | None, clear_number: int) -> tuple[bool, str | None]:
    """May a hybrid consumer plan on this producer plan? Returns (usable, failure reason or None).

    ``clear_number`` is the DAG run's (Airflow counts every clear of its tasks): a plan written before
    the last clear belongs to output that may be about to be replaced, so it is used only if that plan
    is committed (then its output is final and the producer, if it reruns on the same plan, reuses it).
    A producer task that failed after the last clear fails the consumer instead of keeping it waiting.
    """
    if task and task.get("state") in NO_COMMIT_TASK_STATES and int(task.get("clear_number") or 0) >= clear_number:
        return False, f"{task['state']} (try {task.get('try_number')}): {task.get('reason') or 'see its task log'}"
    if plan is None:
        return False, None
    if int(plan.get("clear_number") or 0) >= clear_number:
        return True, None
    if committed is not None and committed.get("fingerprint") == plan.get("fingerprint"):
        return True, None
    return False, None


# Airflow task states after which a producer will not commit in this DAG run (unless cleared).
PRODUCER_FAILED_STATES = frozenset({"failed", "upstream_failed", "removed"})
PRODUCER_SKIPPED_STATES = frozenset({"skipped"})


def commit_identity(committed: Mapping[str, Any] | None) -> str | None:
    """What tells two commits of a stage apart (every commit rewrites ``committed_at``), or None for no commit."""
    if committed is None:
        return None
    return f"{committed.get('fingerprint')}@{committed.get('committed_at')}"


def producer_commit_usable(committed: Mapping[str, Any] | None, clear_number: int,
                           airflow_state: str | None = None, seen_at_start: str | None = None) -> bool:
    """May a consumer that started before its producer finished plan on this producer commit?

    Yes if Airflow says the producer task succeeded (that commit is its output for this run, e.g. when
    only the consumer was cleared). Otherwise a commit that was already there when the consumer
    started (``seen_at_start``, its :func:`commit_identity`) may be one a clear is about to replace, so
    it is not taken; nor is one recorded for an earlier ``clear_number`` of the DAG run (known on a
    worker; a trigger does not get it from Airflow and passes 0).
    """
    if committed is None:
        return False
    if airflow_state == "success":
        return True
    if seen_at_start is not None and commit_identity(committed) == seen_at_start:
        return False
    # A record without a clear number predates it or was made in a trigger: no earlier clear is known.
    return int(committed.get("clear_number") or 0) >= clear_number


def producer_record(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What planning a hybrid consumer knows of its producer before it commits (shaped like committed.json).

    The subtask count and plan fingerprint are final; bytes are the producer subtasks' *input* bytes,
    an estimate used only for sizes in the plan (ranges of a hybrid all_to_all input are equal counts).
    """
    return {"stage": plan["stage"], "parallelism": plan["parallelism"], "fingerprint": plan["fingerprint"],
            "hybrid": True,
            "subtasks": {str(i): {"attempt": None, "bytes": int(s.get("input_bytes") or 0), "subpartition_bytes": {}}
                         for i, s in enumerate(plan["subtasks"])}}
