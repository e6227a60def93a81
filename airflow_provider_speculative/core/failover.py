"""FLIP-1 failover regions over persisted exchanges: who reads which partition, what a rerun affects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.core.hybrid import read_attempt
from airflow_provider_speculative.core.plan import StagePlan, file_subpartitions


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


def input_readers(plan: StagePlan) -> InputReaders:
    """Who reads which producer partition in a planned stage (plan version 2)."""
    edges: dict[str, str] = {}
    for entry in (plan.get("inputs") or {}).values():
        if entry["kind"] == "exchange" and edges.get(entry["upstream"]) != "all_to_all":
            edges[entry["upstream"]] = entry["distribution"]
    return InputReaders(edges, plan["parallelism"])


def files_in_range(files: list[dict[str, Any]], subpartitions: list[int] | None) -> list[dict[str, Any]]:
    """The producer files one consumer subtask reads: those with rows in its subpartition range [start, stop), or all.

    A packed file with rows in the range is read too; the reader keeps only the range's rows of it.
    """
    if subpartitions is None:
        return list(files)
    start, stop = subpartitions
    return [f for f in files if any(start <= sp < stop for sp in file_subpartitions(f))]


@dataclass
class Region:
    """Subtasks to rerun, per stage, in producer-first order; ``requested`` is the part the user named."""

    subtasks: dict[str, set[int]] = field(default_factory=dict)
    requested: dict[str, set[int]] = field(default_factory=dict)
    # Consumers of hybrid edges still running that read a rerun partition: they restart with it.
    in_flight: dict[str, set[int]] = field(default_factory=dict)

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
                 downstream: bool = True,
                 in_flight: Mapping[str, Mapping[int, Mapping[str, Any] | None]] | None = None) -> Region:
    """The region an explicit rerun of ``stage`` (all or some subtasks) affects.

    With ``downstream`` (the default) every consumer of a rerun subtask reruns too, transitively: an
    ``all_to_all`` consumer entirely (each of its subtasks reads a subpartition range of every
    producer subtask), a ``pointwise`` consumer only at the same index; so the consumers' results are
    recomputed from the new output. Without it, only the named subtasks rerun, except that readers of a
    non-deterministic stage are always included (their results would no longer match the new output).
    ``all`` reruns every subtask of every affected stage.

    ``in_flight`` maps a consumer stage to its running subtasks and what their live attempts recorded
    reading (``{producer stage: {producer subtask: attempt}}``). Across a ``hybrid`` edge, a running
    consumer that read a rerun partition restarts with it whatever ``downstream`` says, and one that
    has not read it keeps running (it reads whatever is admitted when it gets there); a finished
    consumer follows the blocking rule above.
    """
    region = Region()
    first = set(range(_decided(graph, stage))) if subtasks is None or strategy == "all" else set(subtasks)
    region.add(stage, first)
    region.requested = {stage: set(first)}
    for name in graph.topological_order():
        rerun = region.subtasks.get(name)
        if rerun and in_flight:
            for consumer, _, spec in graph.consumers(name):
                if spec.mode != "hybrid":
                    continue
                readers = {sub for sub, reads in (in_flight.get(consumer) or {}).items()
                           if any(read_attempt(reads, name, p) is not None for p in rerun)}
                if readers:
                    region.add(consumer, readers)
                    region.in_flight.setdefault(consumer, set()).update(readers)
        if not rerun or (not downstream and graph.stages[name].deterministic):
            continue
        for consumer, _, spec in graph.consumers(name):
            parallelism = _decided(graph, consumer)
            if spec.distribution == "pointwise" and strategy != "all":
                region.add(consumer, {s for s in rerun if s < parallelism})
            else:
                region.add(consumer, set(range(parallelism)))
    return region


def _decided(graph: PipelineGraph, stage: str) -> int:
    """A stage's subtask count; the graph must be the run's (built from its plans: 'auto' decided)."""
    parallelism = graph.stages[stage].parallelism
    if not isinstance(parallelism, int):
        raise ValueError(f"stage {stage!r}: parallelism {parallelism!r} is not decided; use the run's planned graph")
    return parallelism


# How Spark reports a file it could not read ([FAILED_READ_FILE] wraps a page CRC mismatch, a truncated or
# vanished file), in a local session's and a Connect client's exceptions alike.
_READ_FAILURES = ("FAILED_READ_FILE", "Encountered error while reading file", "is not a Parquet file",
                  "FileNotFoundException", "CRC checksum verification failed")


def failed_read(text: str, names: Iterable[str]) -> str | None:
    """The first of ``names`` (file names) that Spark's error ``text`` reports it failed to read; else None."""
    if not any(marker in text for marker in _READ_FAILURES):
        return None
    return next((name for name in names if name and name in text), None)


def read_failure_reason(text: str) -> str:
    """The line of Spark's error that says why the read failed (a Py4J error's first line says only the call)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in reversed(_READ_FAILURES):  # the innermost cause first
        for line in lines:
            if marker in line:
                return line[:300]
    return lines[0][:300] if lines else ""
