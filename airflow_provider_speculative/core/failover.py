"""FLIP-1 failover regions over persisted exchanges: who reads which partition, what a rerun affects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_speculative.core.graph import PipelineGraph, subpartition_range


def input_readers(plan: dict[str, Any]) -> dict[tuple[str, int], frozenset[int]]:
    """(producer stage, producer subtask) -> subtasks of the planned stage whose input includes it."""
    readers: dict[tuple[str, int], set[int]] = {}
    for subtask, spec in enumerate(plan["subtasks"]):
        for entry in spec["inputs"].values():
            if entry["kind"] != "exchange":
                continue
            for part in entry["parts"]:
                readers.setdefault((entry["upstream"], part["subtask"]), set()).add(subtask)
    return {key: frozenset(value) for key, value in readers.items()}


def files_in_range(files: list[dict[str, Any]], distribution: str, consumer: int, consumer_parallelism: int,
                   max_parallelism: int) -> list[dict[str, Any]]:
    """The producer files one consumer subtask reads: its subpartition range, or all for pointwise."""
    if distribution == "pointwise":
        return list(files)
    wanted = set(subpartition_range(consumer, consumer_parallelism, max_parallelism))
    return [f for f in files if f.get("subpartition") in wanted]


@dataclass
class Region:
    """Subtasks to rerun, per stage, in producer-first order; ``requested`` is the part the user named."""

    subtasks: dict[str, set[int]] = field(default_factory=dict)
    requested: dict[str, set[int]] = field(default_factory=dict)

    def add(self, stage: str, subtasks: set[int]) -> bool:
        """Add subtasks; return True if anything was new."""
        before = len(self.subtasks.get(stage, set()))
        self.subtasks.setdefault(stage, set()).update(subtasks)
        return len(self.subtasks[stage]) > before

    def downstream(self) -> dict[str, set[int]]:
        """The subtasks the region adds to the requested ones (consumers, transitively)."""
        extra = {stage: subs - self.requested.get(stage, set()) for stage, subs in self.subtasks.items()}
        return {stage: subs for stage, subs in extra.items() if subs}


def rerun_region(graph: PipelineGraph, stage: str, subtasks: set[int] | None, strategy: str = "region",
                 downstream: bool = True) -> Region:
    """The region an explicit rerun of ``stage`` (all or some subtasks) affects.

    With ``downstream`` (the default) every consumer of a rerun subtask reruns too, transitively: an
    ``all_to_all`` consumer entirely (each of its subtasks reads a subpartition range of every
    producer subtask), a ``pointwise`` consumer only at the same index; so the consumers' results are
    recomputed from the new output. Without it, only the named subtasks rerun, except that readers of a
    non-deterministic stage are always included (their results would no longer match the new output).
    ``all`` reruns every subtask of every affected stage.
    """
    region = Region()
    first = set(range(graph.stages[stage].parallelism)) if subtasks is None or strategy == "all" else set(subtasks)
    region.add(stage, first)
    region.requested = {stage: set(first)}
    for name in graph.topological_order():
        rerun = region.subtasks.get(name)
        if not rerun or (not downstream and graph.stages[name].deterministic):
            continue
        for consumer, _, spec in graph.consumers(name):
            parallelism = graph.stages[consumer].parallelism
            if spec.distribution == "pointwise" and strategy != "all":
                region.add(consumer, {s for s in rerun if s < parallelism})
            else:
                region.add(consumer, set(range(parallelism)))
    return region
