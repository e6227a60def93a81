"""FLIP-1 failover regions over persisted exchanges: who reads which partition, what a rerun affects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_speculative.core.graph import PipelineGraph


class InputReaders:
    """(producer stage, producer subtask) -> the consumer subtasks reading it, without listing every pair.

    An all_to_all consumer reads its range from every producer, a pointwise one only producer ``i``:
    storing that per edge keeps a 1,000 x 1,000 exchange at two entries instead of a million.
    """

    def __init__(self, edges: dict[str, str], parallelism: int) -> None:
        self.edges = edges  # upstream stage -> "all_to_all" | "pointwise"
        self.parallelism = parallelism

    def get(self, key: tuple[str, int], default: frozenset[int] = frozenset()) -> frozenset[int]:
        """The consumers of ``key``, or ``default`` if this stage does not read that producer."""
        stage, producer = key
        distribution = self.edges.get(stage)
        if distribution is None:
            return default
        if distribution == "pointwise":
            return frozenset({producer}) if 0 <= producer < self.parallelism else default
        return frozenset(range(self.parallelism))


def input_readers(plan: dict[str, Any]) -> InputReaders:
    """Who reads which producer partition in a planned stage (plan version 2)."""
    edges: dict[str, str] = {}
    for entry in (plan.get("inputs") or {}).values():
        if entry["kind"] == "exchange" and edges.get(entry["upstream"]) != "all_to_all":
            edges[entry["upstream"]] = entry["distribution"]
    return InputReaders(edges, plan["parallelism"])


def files_in_range(files: list[dict[str, Any]], subpartitions: list[int] | None) -> list[dict[str, Any]]:
    """The producer files one consumer subtask reads: its subpartition range [start, stop), or all."""
    if subpartitions is None:
        return list(files)
    start, stop = subpartitions
    return [f for f in files if f.get("subpartition") is not None and start <= f["subpartition"] < stop]


@dataclass
class Region:
    """Subtasks to rerun, per stage, in producer-first order."""

    subtasks: dict[str, set[int]] = field(default_factory=dict)

    def add(self, stage: str, subtasks: set[int]) -> bool:
        """Add subtasks; return True if anything was new."""
        before = len(self.subtasks.get(stage, set()))
        self.subtasks.setdefault(stage, set()).update(subtasks)
        return len(self.subtasks[stage]) > before


def rerun_region(graph: PipelineGraph, stage: str, subtasks: set[int] | None, strategy: str = "region") -> Region:
    """The region an explicit rerun of ``stage`` (all or some subtasks) affects.

    Each rerun subtask is its own region (persisted exchanges); its consumers are affected only if the
    rerun stage is not deterministic (a deterministic stage re-produces the same data). ``all``
    reruns every subtask of every affected stage.
    """
    region = Region()
    first = set(range(graph.stages[stage].parallelism)) if subtasks is None or strategy == "all" else set(subtasks)
    region.add(stage, first)
    for name in graph.topological_order():
        rerun = region.subtasks.get(name)
        if not rerun or graph.stages[name].deterministic:
            continue
        for consumer, _, spec in graph.consumers(name):
            parallelism = graph.stages[consumer].parallelism
            if spec.distribution == "pointwise" and strategy != "all":
                region.add(consumer, {s for s in rerun if s < parallelism})
            else:
                region.add(consumer, set(range(parallelism)))
    return region
