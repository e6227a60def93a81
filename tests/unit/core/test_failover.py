"""FLIP-1 failover rules in the core: backtracking to lost partitions, waiting readers, regions, limits."""

from __future__ import annotations

from dataclasses import replace

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.failover import input_readers, rerun_region
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.messages import (
    Admit,
    CompleteStage,
    FailStage,
    InputRestored,
    Invalidate,
    Launch,
    RecoverPartition,
    RecoveryFailed,
)
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import Attempt, AttemptState
from tests.unit.core.scheduler_helpers import restore, step

S = AttemptState
ALL_READ_SCAN = {("scan", p): frozenset({0, 1}) for p in range(4)}


def consumer(deterministic: bool = True, **config) -> StageScheduler:
    """A 2-subtask consumer of a 4-subtask 'scan' stage over an all_to_all edge."""
    return StageScheduler(parallelism=2, config=SpeculativeConfig(**config), input_readers=ALL_READ_SCAN,
                          upstreams={"scan": (4, deterministic)})


def lost(sched: StageScheduler, subtask: int, number: int, producer: int, at: float = 5.0) -> Attempt:
    """The attempt failed with exit code 3: input partition scan[producer] (attempt 0) missing."""
    return replace(sched.attempts[subtask][number], state=S.FAILED, deploying_at=0.0, end_at=at, exit_code=3,
                   cause="missing partition", failure={"kind": "partition", "stage": "scan",
                                                       "subtask": producer, "attempt": 0})


def of(actions: list, kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def test_lost_partition_reruns_exactly_its_producer_and_readers_wait() -> None:
    sched = consumer()
    step(sched, 0.0)
    actions = step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    assert [(a.stage, a.subtask, a.lost_attempt) for a in of(actions, RecoverPartition)] == [("scan", 2, 0)]
    assert of(actions, Launch) == []  # subtask 0 waits for scan[2]; subtask 1 still runs
    assert sched.waiting == {0: {("scan", 2)}, 1: {("scan", 2)}}
    # The lost input is not the subtask's fault: it does not count against max_failures_per_subtask.
    assert sched.failures(0) == 0 and sched.stage_failures() == 1


def test_a_second_reader_failing_on_the_same_partition_starts_no_second_recovery() -> None:
    sched = consumer()
    step(sched, 0.0)
    step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    assert of(step(sched, 6.0, [lost(sched, 1, 0, producer=2, at=6.0)]), RecoverPartition) == []


def test_restored_input_releases_the_waiting_subtasks() -> None:
    sched = consumer()
    step(sched, 0.0)
    step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    assert sched.handle(InputRestored("scan", 2)) == []  # deterministic producer: nothing invalidated
    actions = step(sched, 30.0)
    assert [(a.subtask, a.attempt, a.reason) for a in of(actions, Launch)] == [(0, 1, "rerun after lost input")]


def test_non_deterministic_producer_reruns_finished_readers_too() -> None:
    sched = consumer(deterministic=False)
    step(sched, 0.0)
    step(sched, 4.0, [replace(sched.attempts[1][0], state=S.FINISHED, deploying_at=0.0, end_at=4.0)])
    assert sched.admitted == {1: 0}
    step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    invalidated = sched.handle(InputRestored("scan", 2))
    assert [(a.subtask, a.attempt) for a in of(invalidated, Invalidate)] == [(1, 0)]
    assert sorted((a.subtask, a.attempt) for a in of(step(sched, 30.0), Launch)) == [(0, 1), (1, 1)]


def test_deterministic_producer_keeps_finished_readers() -> None:
    sched = consumer(deterministic=True)
    step(sched, 0.0)
    step(sched, 4.0, [replace(sched.attempts[1][0], state=S.FINISHED, deploying_at=0.0, end_at=4.0)])
    step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    sched.handle(InputRestored("scan", 2))
    assert sched.admitted == {1: 0}
    assert [(a.subtask, a.attempt) for a in of(step(sched, 30.0), Launch)] == [(0, 1)]


def test_strategy_all_reruns_every_producer_subtask() -> None:
    sched = consumer(failover_strategy="all")
    step(sched, 0.0)
    actions = step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    assert sorted(a.subtask for a in of(actions, RecoverPartition)) == [0, 1, 2, 3]


def test_failed_recovery_fails_the_stage_with_the_causes() -> None:
    sched = consumer()
    step(sched, 0.0)
    step(sched, 5.0, [lost(sched, 0, 0, producer=2)])
    actions = sched.handle(RecoveryFailed("scan", 2, "3 recovery attempts failed"))
    (fail,) = of(actions, FailStage)
    assert "could not re-produce lost partition scan[2]" in fail.reason
    assert any("subtask 0 attempt 0" in cause for cause in fail.causes)


def test_stage_failure_limit_counts_every_failed_attempt() -> None:
    sched = StageScheduler(parallelism=3, config=SpeculativeConfig(max_failures_per_stage=1))
    step(sched, 0.0)
    step(sched, 1.0, [replace(sched.attempts[0][0], state=S.FAILED, cause="boom")])
    actions = step(sched, 2.0, [replace(sched.attempts[1][0], state=S.FAILED, cause="bang")])
    (fail,) = of(actions, FailStage)
    assert "max_failures_per_stage = 1" in fail.reason and len(fail.causes) == 2


def test_restart_admits_a_finished_attempt_the_old_controller_never_admitted() -> None:
    sched = StageScheduler(parallelism=1, config=SpeculativeConfig())
    restore(sched, [Attempt(0, 0, "local-a", S.FINISHED, deploying_at=0.0, end_at=9.0)], {}, {})
    actions = step(sched, 10.0)
    assert [(a.subtask, a.attempt) for a in of(actions, Admit)] == [(0, 0)]
    assert of(actions, CompleteStage)


def test_restart_during_recovery_backtracks_again() -> None:
    sched = consumer()
    failed = Attempt(0, 0, "local-a", S.FAILED, deploying_at=0.0, end_at=5.0,
                     failure={"kind": "partition", "stage": "scan", "subtask": 2, "attempt": 0})
    restore(sched, [failed, Attempt(1, 0, "local-b", S.RUNNING, deploying_at=0.0)], {}, {})
    actions = step(sched, 20.0)
    assert [(a.stage, a.subtask) for a in of(actions, RecoverPartition)] == [("scan", 2)]
    assert of(actions, Launch) == []


def graph(deterministic: bool) -> PipelineGraph:
    return PipelineGraph("p", {
        "scan": StageSpec("scan", "a.py", 4, {"src": SourceSpec("/d")}, deterministic=deterministic),
        "agg": StageSpec("agg", "b.py", 2, {"x": ExchangeSpec("scan", "all_to_all", ("k",))}),
        "enrich": StageSpec("enrich", "c.py", 4, {"x": ExchangeSpec("scan", "pointwise")}),
    })


def test_rerun_region_includes_downstream_consumers_by_default() -> None:
    region = rerun_region(graph(True), "scan", {1})
    # all_to_all: every consumer subtask reads a range of scan[1]'s subpartitions; pointwise: only index 1.
    assert region.subtasks == {"scan": {1}, "agg": {0, 1}, "enrich": {1}}
    assert region.requested == {"scan": {1}}
    assert region.downstream() == {"agg": {0, 1}, "enrich": {1}}


def test_rerun_region_is_transitive_and_follows_each_edge_kind() -> None:
    chain = PipelineGraph("p", {
        "scan": StageSpec("scan", "a.py", 4, {"src": SourceSpec("/d")}),
        "enrich": StageSpec("enrich", "b.py", 4, {"x": ExchangeSpec("scan", "pointwise")}),
        "tag": StageSpec("tag", "c.py", 4, {"x": ExchangeSpec("enrich", "pointwise")}),
        "agg": StageSpec("agg", "d.py", 3, {"x": ExchangeSpec("tag", "all_to_all", ("k",))}),
        "final": StageSpec("final", "e.py", 3, {"x": ExchangeSpec("agg", "pointwise")}),
    })
    region = rerun_region(chain, "scan", {2, 3})
    assert region.subtasks == {"scan": {2, 3}, "enrich": {2, 3}, "tag": {2, 3}, "agg": {0, 1, 2},
                               "final": {0, 1, 2}}
    # A region starting in the middle never reaches upstream.
    assert rerun_region(chain, "tag", {0}).subtasks == {"tag": {0}, "agg": {0, 1, 2}, "final": {0, 1, 2}}


def test_rerun_region_without_downstream_is_just_the_named_subtasks() -> None:
    region = rerun_region(graph(True), "scan", {1}, downstream=False)
    assert region.subtasks == {"scan": {1}} and region.downstream() == {}


def test_rerun_region_without_downstream_still_includes_readers_of_a_non_deterministic_stage() -> None:
    region = rerun_region(graph(False), "scan", {1}, downstream=False)
    assert region.subtasks == {"scan": {1}, "agg": {0, 1}, "enrich": {1}}


def test_rerun_region_of_a_whole_stage() -> None:
    region = rerun_region(graph(True), "scan", None)
    assert region.requested == {"scan": {0, 1, 2, 3}}
    assert region.subtasks == {"scan": {0, 1, 2, 3}, "agg": {0, 1}, "enrich": {0, 1, 2, 3}}


def test_rerun_region_strategy_all() -> None:
    assert rerun_region(graph(True), "scan", {1}, strategy="all", downstream=False).subtasks == {
        "scan": {0, 1, 2, 3}}
    assert rerun_region(graph(True), "scan", {1}, strategy="all").subtasks == {
        "scan": {0, 1, 2, 3}, "agg": {0, 1}, "enrich": {0, 1, 2, 3}}


def test_input_readers_from_a_plan() -> None:
    plan = {"parallelism": 3, "inputs": {
        "x": {"kind": "exchange", "upstream": "scan", "distribution": "all_to_all"},
        "y": {"kind": "exchange", "upstream": "dim", "distribution": "pointwise"},
        "z": {"kind": "source"}}}
    readers = input_readers(plan)
    assert readers.get(("scan", 5)) == frozenset({0, 1, 2})  # every consumer reads a range of every producer
    assert readers.get(("dim", 1)) == frozenset({1})
    assert readers.get(("dim", 7)) == frozenset()
    assert readers.get(("other", 0), frozenset({9})) == frozenset({9})
