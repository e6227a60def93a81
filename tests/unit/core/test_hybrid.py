"""Hybrid exchanges (FLIP-235) in the core: which consumers may start, slot reservation, failover in flight."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig, Target
from airflow_provider_speculative.core.failover import InputReaders, rerun_region
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.hybrid import (
    HybridEdge,
    consumer_slots,
    hybrid_edges,
    launchable,
    producer_plan_usable,
    producer_record,
    required_admitted,
    restarts_on_withdrawal,
    waiting_for,
)
from airflow_provider_speculative.core.messages import (
    Admit,
    Cancel,
    FailStage,
    InputFailed,
    InputsAdmitted,
    InputWithdrawn,
    Invalidate,
    Launch,
    Tick,
)
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import AttemptState
from tests.unit.core.scheduler_helpers import step

S = AttemptState
POINTWISE = HybridEdge("scan", "scan", "pointwise", 4, tuple((i, i + 1) for i in range(4)))
ALL_TO_ALL = HybridEdge("scan", "scan", "all_to_all", 4, ((0, 4), (0, 4)))


def of(actions: list, kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def consumer(edge: HybridEdge = POINTWISE, parallelism: int = 4, slots: int = 4, deterministic: bool = True,
             targets: tuple[Target, ...] | None = None, **config) -> StageScheduler:
    """A consumer of 'scan' over a hybrid edge, on one target with ``slots`` slots (or ``targets``)."""
    distribution = {"scan": edge.distribution}
    return StageScheduler(parallelism=parallelism,
                          config=SpeculativeConfig(targets=targets or (Target("t", slots=slots),), **config),
                          input_readers=InputReaders(distribution, parallelism),
                          upstreams={"scan": (edge.producer_parallelism, deterministic)}, hybrid={"scan": edge})


# -- pure rules -----------------------------------------------------------------------------------


def test_pointwise_needs_its_own_producer_only() -> None:
    edges = {"scan": POINTWISE}
    assert launchable(edges, 2, {"scan": {2: 0}}, share=0.5)
    assert not launchable(edges, 1, {"scan": {2: 0}}, share=0.5)
    assert launchable(edges, 1, {}, share=0.5, committed={"scan": True})  # committed: nothing gates


@pytest.mark.parametrize(("share", "needed"), [(0.5, 2), (0.25, 1), (1.0, 4), (0.01, 1), (0.75, 3)])
def test_all_to_all_needs_a_share_of_its_producer_range(share: float, needed: int) -> None:
    assert required_admitted(ALL_TO_ALL, 0, share) == needed
    admitted = {p: 0 for p in range(needed)}
    assert launchable({"scan": ALL_TO_ALL}, 0, {"scan": admitted}, share)
    assert not launchable({"scan": ALL_TO_ALL}, 0, {"scan": dict(list(admitted.items())[:-1])}, share)


def test_waiting_for_says_how_many_partitions_are_admitted() -> None:
    assert waiting_for({"scan": ALL_TO_ALL}, 0, {"scan": {0: 0, 3: 1, 1: 0}}) == \
        "waiting for input 'scan': producer partitions 3/4 admitted (scan)"
    assert waiting_for({"scan": POINTWISE}, 1, {"scan": {1: 0}}) is None


def test_a_consumer_never_takes_the_slots_its_producers_still_need() -> None:
    assert consumer_slots(4, 0) == 4
    assert consumer_slots(4, 3) == 1
    assert consumer_slots(2, 5) == 0


def test_only_attempts_that_read_the_withdrawn_attempt_restart() -> None:
    reads = {(0, 0): {"scan": {"0": 1}}, (1, 0): {"scan": {"0": 0}}, (2, 0): None, (3, 0): {"other": {"0": 1}}}
    assert restarts_on_withdrawal(reads, "scan", 0, 1) == [(0, 0)]
    assert restarts_on_withdrawal(reads, "scan", 0, 2) == []


def test_a_plan_from_before_the_last_clear_is_used_only_if_committed() -> None:
    plan = {"fingerprint": "f1", "clear_number": 0}
    assert producer_plan_usable(None, None, None, 0) == (False, None)
    assert producer_plan_usable(plan, None, None, 0) == (True, None)
    assert producer_plan_usable(plan, None, None, 1) == (False, None)  # stale: the producer will replan
    assert producer_plan_usable(plan, None, {"fingerprint": "f1"}, 1) == (True, None)
    assert producer_plan_usable(plan, None, {"fingerprint": "f0"}, 1) == (False, None)
    usable, failure = producer_plan_usable(plan, {"state": "failed", "clear_number": 1, "try_number": 2,
                                                  "reason": "PlanError: boom"}, None, 1)
    assert not usable and "failed (try 2): PlanError: boom" in failure
    # A producer stopped from outside will not commit this try either.
    usable, failure = producer_plan_usable(plan, {"state": "killed", "clear_number": 1, "try_number": 1,
                                                  "reason": "stopped from outside"}, None, 1)
    assert not usable and "killed (try 1): stopped from outside" in failure
    # A failure before the last clear is history: the producer runs again.
    assert producer_plan_usable(None, {"state": "failed", "clear_number": 0}, None, 1) == (False, None)


def test_hybrid_edges_and_producer_record_come_from_plans() -> None:
    plan = {"inputs": {"a": {"kind": "exchange", "mode": "hybrid", "upstream": "scan", "distribution": "pointwise",
                             "producer_parallelism": 2},
                       "b": {"kind": "exchange", "mode": "blocking", "upstream": "dim", "distribution": "all_to_all",
                             "producer_parallelism": 3}},
            "subtasks": [{"inputs": {"a": {"producers": [0, 1]}}}, {"inputs": {"a": {"producers": [1, 2]}}}]}
    assert hybrid_edges(plan) == {"a": HybridEdge("a", "scan", "pointwise", 2, ((0, 1), (1, 2)))}
    record = producer_record({"stage": "scan", "parallelism": 2, "fingerprint": "f",
                              "subtasks": [{"input_bytes": 10}, {}]})
    assert record["hybrid"] and record["parallelism"] == 2 and record["subtasks"]["1"]["bytes"] == 0


# -- the scheduler --------------------------------------------------------------------------------


def test_pointwise_consumers_start_as_their_producers_are_admitted() -> None:
    sched = consumer()
    assert of(step(sched, 0.0), Launch) == []
    assert sched.input_blocked == {0, 1, 2, 3}
    assert sched.input_wait(2) == "waiting for input 'scan': producer partitions 0/1 admitted (scan)"
    actions = sched.handle(InputsAdmitted("scan", {2: 0, 0: 1}), Tick(1.0))
    assert sorted(a.subtask for a in of(actions, Launch)) == [0, 2]
    # A quiet tick launches nothing more and looks at no blocked subtask.
    assert of(step(sched, 2.0), Launch) == []
    actions = sched.handle(InputsAdmitted("scan", {1: 0, 3: 0}, committed=True), Tick(3.0))
    assert sorted(a.subtask for a in of(actions, Launch)) == [1, 3]


def test_pointwise_chains_finish_independently() -> None:
    sched = consumer()
    step(sched, 0.0)
    sched.handle(InputsAdmitted("scan", {1: 0}), Tick(1.0))
    done = replace(sched.attempts[1][0], state=S.FINISHED, deploying_at=1.0, end_at=2.0)
    assert [(a.subtask, a.attempt) for a in of(step(sched, 2.0, [done]), Admit)] == [(1, 0)]
    assert sched.done_subtasks() == {1}  # while producers 0, 2, 3 still run


def test_all_to_all_consumers_start_at_the_configured_share() -> None:
    sched = consumer(ALL_TO_ALL, parallelism=2, hybrid_min_admitted_share=0.5)
    step(sched, 0.0)
    assert of(sched.handle(InputsAdmitted("scan", {0: 0}), Tick(1.0)), Launch) == []
    assert len(of(sched.handle(InputsAdmitted("scan", {3: 0}), Tick(2.0)), Launch)) == 2


def test_consumers_keep_free_the_slots_waiting_producers_need() -> None:
    sched = consumer(slots=2)
    step(sched, 0.0)
    # Two producers still wait for a slot: the consumer takes none of the two free ones.
    assert of(sched.handle(InputsAdmitted("scan", {0: 0, 1: 0}, waiting=2), Tick(1.0)), Launch) == []
    assert len(of(sched.handle(InputsAdmitted("scan", {}, waiting=1), Tick(2.0)), Launch)) == 1
    assert len(of(sched.handle(InputsAdmitted("scan", {}, waiting=0), Tick(3.0)), Launch)) == 1


def test_a_withdrawn_partition_restarts_exactly_the_attempt_that_read_it() -> None:
    sched = consumer()
    step(sched, 0.0)
    sched.handle(InputsAdmitted("scan", {0: 0, 1: 0}), Tick(1.0))
    reader = replace(sched.attempts[0][0], state=S.RUNNING, deploying_at=1.0, progress={"reads": {"scan": {"0": 0}}})
    other = replace(sched.attempts[1][0], state=S.RUNNING, deploying_at=1.0, progress={"reads": {"scan": {"1": 0}}})
    step(sched, 2.0, [reader, other])
    actions = sched.handle(InputWithdrawn("scan", 0, 0, "lost"), Tick(3.0))
    assert [(a.subtask, a.attempt) for a in of(actions, Cancel)] == [(0, 0)]
    assert "scan[0] attempt 0" in of(actions, Cancel)[0].reason
    # It restarts only once scan[0] is admitted again, and reads the new attempt.
    cancelled = replace(sched.attempts[0][0], state=S.CANCELED, end_at=3.5)
    assert of(step(sched, 4.0, [cancelled]), Launch) == []
    actions = sched.handle(InputsAdmitted("scan", {0: 1}), Tick(5.0))
    assert [(a.subtask, a.attempt) for a in of(actions, Launch)] == [(0, 1)]
    assert sched.failures(0) == 0  # a withdrawn input is not the subtask's fault


def test_the_reads_observed_in_the_same_check_decide_who_restarts() -> None:
    sched = consumer()
    step(sched, 0.0)
    sched.handle(InputsAdmitted("scan", {0: 0}), Tick(1.0))
    fresh = replace(sched.attempts[0][0], state=S.RUNNING, deploying_at=1.0, progress={"reads": {"scan": {"0": 0}}})
    from airflow_provider_speculative.core.messages import AttemptObserved

    actions = sched.handle(AttemptObserved(fresh), InputWithdrawn("scan", 0, 0, "lost"), Tick(2.0))
    assert [(a.subtask, a.attempt) for a in of(actions, Cancel)] == [(0, 0)]


def test_finished_readers_of_a_non_deterministic_producer_rerun() -> None:
    sched = consumer(deterministic=False)
    step(sched, 0.0)
    sched.handle(InputsAdmitted("scan", {2: 0}), Tick(1.0))
    step(sched, 2.0, [replace(sched.attempts[2][0], state=S.FINISHED, deploying_at=1.0, end_at=2.0)])
    actions = sched.handle(InputWithdrawn("scan", 2, 0, "lost"), Tick(3.0))
    assert [(a.subtask, a.attempt) for a in of(actions, Invalidate)] == [(2, 0)]
    deterministic = consumer()
    step(deterministic, 0.0)
    deterministic.handle(InputsAdmitted("scan", {2: 0}), Tick(1.0))
    step(deterministic, 2.0, [replace(deterministic.attempts[2][0], state=S.FINISHED, deploying_at=1.0, end_at=2.0)])
    assert of(deterministic.handle(InputWithdrawn("scan", 2, 0, "lost"), Tick(3.0)), Invalidate) == []


def test_a_speculative_copy_reads_the_same_admitted_inputs_and_the_first_finisher_wins() -> None:
    sched = consumer(enabled=True, baseline_lower_bound=0.0, baseline_ratio=0.5, max_concurrent_executions=2,
                     targets=(Target("a", slots=4), Target("b", slots=4)))
    step(sched, 0.0)
    sched.handle(InputsAdmitted("scan", {p: 0 for p in range(4)}, committed=False), Tick(1.0))
    fast = [replace(sched.attempts[s][0], state=S.FINISHED, deploying_at=1.0, end_at=2.0) for s in (0, 1, 2)]
    slow = replace(sched.attempts[3][0], state=S.RUNNING, deploying_at=1.0)
    step(sched, 2.0, [*fast, slow])
    copies = of(step(sched, 60.0), Launch)
    assert [(a.subtask, a.speculative) for a in copies] == [(3, True)]  # gated by the same admitted input
    copy = replace(sched.attempts[3][1], state=S.FINISHED, deploying_at=60.0, end_at=61.0)
    actions = step(sched, 61.0, [copy])
    assert [(a.subtask, a.attempt) for a in of(actions, Admit)] == [(3, 1)]
    assert [(a.subtask, a.attempt) for a in of(actions, Cancel)] == [(3, 0)]


def test_a_failed_producer_fails_the_consumer_once() -> None:
    sched = consumer()
    step(sched, 0.0)
    actions = sched.handle(InputFailed("scan", "pipeline 'p', stage 'c', input 'scan': producer failed"), Tick(1.0))
    assert [a.reason for a in of(actions, FailStage)] == ["pipeline 'p', stage 'c', input 'scan': producer failed"]
    assert sched.handle(InputFailed("scan", "again"), Tick(2.0)) == []


# -- failover regions mixing blocking and hybrid edges ---------------------------------------------


def _graph() -> PipelineGraph:
    src = {"src": SourceSpec("/data/x")}
    stages = {
        "scan": StageSpec("scan", "a.py", 4, src),
        "enrich": StageSpec("enrich", "a.py", 4, {"scan": ExchangeSpec("scan", "pointwise", mode="hybrid")}),
        "agg": StageSpec("agg", "a.py", 2, {"enrich": ExchangeSpec("enrich", "all_to_all", ("k",), mode="hybrid")}),
        "report": StageSpec("report", "a.py", 2, {"agg": ExchangeSpec("agg", "all_to_all", ("k",))}),
    }
    return PipelineGraph("p", stages)


def test_region_restarts_running_hybrid_readers_of_the_partition_and_no_one_else() -> None:
    graph = _graph()
    in_flight = {"enrich": {1: {"scan": {"1": 0}}, 2: {"scan": {"2": 0}}, 3: None},
                 "agg": {0: {"enrich": {"1": 0}}, 1: {"enrich": {"3": 0}}}}
    region = rerun_region(graph, "scan", {1}, downstream=False, in_flight=in_flight)
    # enrich[1] read scan[1]; agg[0] read enrich[1] (restarted in turn); agg[1] read only enrich[3].
    assert region.subtasks == {"scan": {1}, "enrich": {1}, "agg": {0}}
    assert region.in_flight == {"enrich": {1}, "agg": {0}}
    # The blocking edge to report adds nothing without --downstream (agg is deterministic).
    assert "report" not in region.subtasks


def test_region_with_downstream_includes_blocking_consumers_as_before() -> None:
    region = rerun_region(_graph(), "scan", {1}, in_flight={"enrich": {2: {"scan": {"2": 0}}}})
    assert region.subtasks == {"scan": {1}, "enrich": {1}, "agg": {0, 1}, "report": {0, 1}}
    assert region.in_flight == {}
