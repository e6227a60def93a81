"""Critical-path-first slot claims between the stage runs of one DAG run (``[speculative] slot_priority``).

Independent stages of a DAG run overlap and share their targets' slots. First come, first served lets
a stage with a short chain after it (a large scan feeding the last join) take the slots a stage with a
long chain after it (a small scan feeding a join that feeds that same last join) needs: the long chain
then starts late and the run ends with idle slots while it finishes. The stages' own work is the same in
any order, so what an order of claims can save is that tail; it is shortest when the stages with the
longest chain of work *after* them finish first.

* **Priority** (:func:`stage_priorities`, from the pipeline graph when a stage is planned): the longest
  chain of downstream stages after a stage, each weighing its estimated waves,
  ``ceil(parallelism / slots)`` and at least 1 (a stage also costs its start: scheduling, planning,
  sessions). A sink's priority is 0. Every stage of the pipeline gets its priority in every plan, so
  a controller knows which stages of its run are ahead of it without reading their plans.
* **Demand** (:class:`Demand`): what a waiting stage run publishes in the store: its priority, its
  originals waiting for a slot (at most its targets' capacity, so a 10,000-subtask stage rewrites it
  only in its last wave), its targets and when it was written.
* **The rule** (:func:`claimable_slots`): a stage run may claim each target's free slots minus those
  reserved for the live demand of higher-priority stage runs of its DAG run that share the target. A
  demand older than :data:`DEMAND_TTL`, of pending 0 (the stage run ended or launched everything), or
  unreadable is ignored, so a crashed controller holds back nobody for long. No starvation: a demand
  counts only originals not launched yet, so a lower-priority stage yields exactly the slots the
  higher ones can take now and gets every other one; speculative copies and reruns of a lower-priority
  stage draw from the same remainder, and those of a higher-priority stage are never held back.

Everything here is pure (no I/O); the store side is ``store/demand.py``, the controller's
``control/controller.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_speculative.core.config import CRITICAL_PATH as CRITICAL_PATH
from airflow_provider_speculative.core.config import FIFO as FIFO
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import PipelineGraph

# A waiting controller rewrites its demand at least this often (and whenever its pending count changes);
# a demand not rewritten for DEMAND_TTL is a crashed or stopped controller's and is ignored.
DEMAND_REFRESH = 10.0
DEMAND_TTL = 30.0


def stage_waves(parallelism: int | str, min_parallelism: int | None, slots: int | None) -> int:
    """A stage's estimated work in waves of its targets' slots: ``ceil(parallelism / slots)``, at least 1.

    An ``auto`` parallelism is decided only when the stage is planned: its lower bound stands for it.
    Unknown slots (a reactive target) count each stage as one wave.
    """
    count = parallelism if isinstance(parallelism, int) else (min_parallelism or 1)
    if not slots or slots <= 0:
        return 1
    return max(1, math.ceil(count / slots))


def priority_slots(config: SpeculativeConfig) -> int | None:
    """The slots a wave of the stage's targets has; None when a reactive target's capacity is not known at plan."""
    if any(t.auto_slots for t in config.targets):
        return None
    return sum(t.slots for t in config.targets)


def stage_priorities(graph: PipelineGraph, slots: int | None) -> dict[str, int]:
    """Stage -> the longest chain of estimated waves of the stages that can start only after it.

    O(stages + edges): one pass over the stages, consumers first.
    """
    consumers: dict[str, set[str]] = {name: set() for name in graph.stages}
    for name in graph.stages:
        for upstream in graph.upstreams(name):
            consumers[upstream].add(name)
    waves = {name: stage_waves(spec.parallelism, spec.min_parallelism, slots) for name, spec in graph.stages.items()}
    chain: dict[str, int] = {}
    for name in reversed(graph.topological_order()):
        chain[name] = max((waves[c] + chain[c] for c in consumers[name]), default=0)
    return chain


@dataclass(frozen=True)
class Demand:
    """One stage run's published demand: originals waiting for a slot of ``targets``, at ``priority``."""

    stage: str
    priority: float
    pending: int
    targets: tuple[str, ...]
    at: float

    def to_json(self) -> dict[str, Any]:
        """The record ``store/demand.py`` writes."""
        return {"stage": self.stage, "priority": self.priority, "pending": self.pending,
                "targets": list(self.targets), "at": self.at}

    @classmethod
    def from_json(cls, record: Any) -> Demand | None:
        """The demand a record states, or None for one that is not a demand (ignored, never trusted)."""
        if not isinstance(record, Mapping):
            return None
        try:
            targets = record["targets"]
            if not isinstance(targets, list):
                return None
            return cls(stage=str(record["stage"]), priority=float(record["priority"]),
                       pending=max(0, int(record["pending"])), targets=tuple(str(t) for t in targets),
                       at=float(record["at"]))
        except (KeyError, TypeError, ValueError):
            return None


def published_pending(waiting: int, capacity: int) -> int:
    """What a stage run publishes as pending: its waiting originals, never more than its targets' capacity.

    No stage run can be yielded more than every slot, so a larger count says nothing more and would only
    make the demand change (a store write) on every launch of a large stage.
    """
    return max(0, min(waiting, capacity))


def ahead(own_priority: float, demands: Iterable[Demand], own_stage: str, now: float,
          ttl: float = DEMAND_TTL) -> list[Demand]:
    """The demands a stage run yields to: other stages', of higher priority, pending, and fresh.

    Fresh: written within ``ttl`` of ``now`` either way (a record from a clock ahead of ours is not fresh
    for longer than that).
    """
    return [d for d in demands
            if d.stage != own_stage and d.priority > own_priority and d.pending > 0 and abs(now - d.at) <= ttl]


def yielded_slots(free: Mapping[str, int], own_priority: float, demands: Iterable[Demand], own_stage: str,
                  now: float, ttl: float = DEMAND_TTL) -> dict[str, int]:
    """Per target, the free slots reserved for higher-priority demand (targets with none are absent).

    Demands are served highest priority first (ties by stage name), each from the free slots of the
    targets it shares with this stage run, the target with most free slots first; a demand takes at
    most its pending count, so the total yielded never exceeds the higher stages' pending originals.
    O(demands x targets).
    """
    left = {name: max(0, n) for name, n in free.items()}
    yielded: dict[str, int] = {}
    for demand in sorted(ahead(own_priority, demands, own_stage, now, ttl), key=lambda d: (-d.priority, d.stage)):
        want = demand.pending
        for name in sorted((t for t in set(demand.targets) if left.get(t, 0) > 0), key=lambda t: (-left[t], t)):
            if want <= 0:
                break
            take = min(want, left[name])
            left[name] -= take
            yielded[name] = yielded.get(name, 0) + take
            want -= take
    return yielded


def claimable_slots(free: Mapping[str, int], own_priority: float, demands: Iterable[Demand], own_stage: str,
                    now: float, ttl: float = DEMAND_TTL) -> tuple[dict[str, int], dict[str, int]]:
    """(the free slots this stage run may claim per target, the slots it yields per target)."""
    yielded = yielded_slots(free, own_priority, demands, own_stage, now, ttl)
    return {name: max(0, n) - yielded.get(name, 0) for name, n in free.items()}, yielded
