"""Critical-path-first slot claims (core/priority.py): priorities from the graph, and what a stage run may claim."""

from __future__ import annotations

import random

import pytest

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec, StageSpec
from airflow_provider_speculative.core.messages import TargetsObserved, Tick
from airflow_provider_speculative.core.priority import (
    DEMAND_TTL,
    Demand,
    ahead,
    claimable_slots,
    priority_slots,
    published_pending,
    stage_priorities,
    stage_waves,
)
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.exceptions import ConfigError
from tests.factories import planned

NOW = 1_000.0


def q3(join_lineitem: int | str = 4) -> PipelineGraph:
    """TPC-H Q3's stages as dags/tpch_q3.py declares them (parallelism 2, 4, 8 / 2, 4, 1)."""
    def scan(name: str, parallelism: int) -> StageSpec:
        return StageSpec(name, f"/{name}.py", parallelism, {"t": SourceSpec(f"/data/{name}")}, max_parallelism=8)

    stages = [
        scan("scan_customer", 2), scan("scan_orders", 4), scan("scan_lineitem", 8),
        StageSpec("join_orders", "/jo.py", 2, {"o": ExchangeSpec("scan_orders", key=("k",)),
                                               "c": ExchangeSpec("scan_customer", key=("k",))}, max_parallelism=8),
        StageSpec("join_lineitem", "/jl.py", join_lineitem, {"o": ExchangeSpec("join_orders", key=("k",)),
                                                              "l": ExchangeSpec("scan_lineitem", key=("k",))},
                  max_parallelism=8, min_parallelism=3 if join_lineitem == "auto" else None),
        StageSpec("top", "/top.py", 1, {"r": ExchangeSpec("join_lineitem", "broadcast")}),
    ]
    return PipelineGraph("q3", {s.name: s for s in stages})


def demand(stage: str, priority: float, pending: int, targets: tuple[str, ...] = ("a", "b"),
           at: float = NOW) -> Demand:
    return Demand(stage, priority, pending, targets, at)


# -- priorities ------------------------------------------------------------------------------------


def test_q3_feeds_the_longer_chain_first():
    # 4 slots: every downstream stage of Q3 is one wave; join_orders' producers have three stages after them.
    assert stage_priorities(q3(), 4) == {"scan_customer": 3, "scan_orders": 3, "scan_lineitem": 2,
                                         "join_orders": 2, "join_lineitem": 1, "top": 0}


def test_a_downstream_stage_weighs_its_waves():
    # join_lineitem with 8 subtasks on 2 slots is 4 waves: everything before it gains 3.
    priorities = stage_priorities(q3(join_lineitem=8), 2)
    assert priorities["join_lineitem"] == 1 and priorities["scan_lineitem"] == 5
    assert priorities["join_orders"] == 5 and priorities["scan_orders"] == 6


def test_waves_of_auto_and_unknown_slots():
    assert stage_waves(9, None, 4) == 3 and stage_waves(1, None, 4) == 1
    assert stage_waves("auto", 6, 4) == 2 and stage_waves("auto", None, 4) == 1
    # A reactive target's capacity is not known at plan: every stage is one wave.
    assert stage_waves(100, None, None) == 1
    assert stage_priorities(q3(join_lineitem="auto"), None)["scan_orders"] == 3
    assert priority_slots(SpeculativeConfig().with_overrides(
        {"targets": [{"name": "a", "slots": 2}, {"name": "b", "slots": 3}]}, "test")) == 5


def test_every_plan_names_every_stage_with_its_priority():
    graph = q3()
    graph.validate()
    config = SpeculativeConfig().with_overrides({"targets": [{"name": "a", "slots": 2}, {"name": "b", "slots": 2}]},
                                                "test")
    plan = planned(graph, "scan_orders", config, sources={"t": [("/data/scan_orders/f.parquet", 10)]})
    assert plan["priorities"] == stage_priorities(graph, 4)


def test_the_option_takes_critical_path_or_fifo():
    assert SpeculativeConfig().slot_priority == "fifo"  # opt-in until measured (bench/README.md)
    assert (SpeculativeConfig().with_overrides({"slot_priority": "critical_path"}, "test").slot_priority
            == "critical_path")
    with pytest.raises(ConfigError, match="slot_priority"):
        SpeculativeConfig().with_overrides({"slot_priority": "lifo"}, "test")


# -- the rule --------------------------------------------------------------------------------------


def test_a_lower_priority_stage_yields_exactly_the_demanded_slots():
    free = {"a": 2, "b": 1}
    claimable, yielded = claimable_slots(free, 2, [demand("scan_orders", 3, 2)], "scan_lineitem", NOW)
    # Two originals wait ahead of it: two of the three free slots are theirs, the third is this stage's.
    assert yielded == {"a": 2} and claimable == {"a": 0, "b": 1}
    claimable, yielded = claimable_slots(free, 2, [demand("scan_orders", 3, 1)], "scan_lineitem", NOW)
    assert sum(yielded.values()) == 1 and sum(claimable.values()) == 2


def test_demand_counts_only_on_the_targets_it_shares():
    free = {"a": 1, "b": 2}
    claimable, yielded = claimable_slots(free, 0, [demand("x", 1, 5, targets=("a", "z"))], "me", NOW)
    assert yielded == {"a": 1} and claimable == {"a": 0, "b": 2}


def test_demands_are_served_highest_priority_first():
    free = {"a": 3}
    demands = [demand("mid", 2, 2, ("a",)), demand("top", 5, 2, ("a",))]
    _, yielded = claimable_slots(free, 1, demands, "low", NOW)
    assert yielded == {"a": 3}
    # The middle stage yields only to the top one: it may claim the slot the top one cannot use.
    claimable, yielded = claimable_slots(free, 2, demands, "mid", NOW)
    assert yielded == {"a": 2} and claimable == {"a": 1}


@pytest.mark.parametrize("ignored", [
    demand("scan_orders", 3, 2, at=NOW - DEMAND_TTL - 1),  # stale: its controller stopped rewriting it
    demand("scan_orders", 3, 2, at=NOW + DEMAND_TTL + 1),  # from a clock far ahead of ours
    demand("scan_orders", 3, 0),  # the stage run launched everything or ended
    demand("scan_orders", 2, 2),  # equal priority: first come, first served
    demand("join_lineitem", 1, 2),  # lower priority
    demand("scan_lineitem", 9, 2),  # our own record
])
def test_demand_that_does_not_hold_back(ignored):
    free = {"a": 2, "b": 2}
    assert claimable_slots(free, 2, [ignored], "scan_lineitem", NOW) == (free, {})
    assert ahead(2, [ignored], "scan_lineitem", NOW) == []


def test_no_starvation_and_never_more_than_the_demand():
    rng = random.Random(7)
    for _ in range(500):
        free = {t: rng.randint(0, 4) for t in ("a", "b", "c")}
        demands = [demand(f"s{i}", rng.randint(0, 4), rng.randint(0, 6),
                          tuple(rng.sample(["a", "b", "c", "d"], rng.randint(1, 3))),
                          at=NOW - rng.choice([0, 5, DEMAND_TTL + 1])) for i in range(rng.randint(0, 4))]
        own = rng.randint(0, 4)
        claimable, yielded = claimable_slots(free, own, demands, "me", NOW)
        live = ahead(own, demands, "me", NOW)
        assert all(claimable[t] >= 0 and claimable[t] + yielded.get(t, 0) == free[t] for t in free)
        # Never more than the stages ahead can launch now...
        assert sum(yielded.values()) <= sum(d.pending for d in live)
        # ...and every free slot they cannot use (no live demand on it, or more free than demanded) stays ours.
        shared = {t for d in live for t in d.targets}
        assert all(claimable[t] == free[t] for t in free if t not in shared)
        # One target: exactly what the stages ahead wait for, up to what is free.
        on_a = sum(d.pending for d in live if "a" in d.targets)
        single, _ = claimable_slots({"a": free["a"]}, own, demands, "me", NOW)
        assert single["a"] == free["a"] - min(free["a"], on_a)


def test_published_pending_is_bounded_by_capacity():
    assert published_pending(10_000, 4) == 4 and published_pending(3, 4) == 3 and published_pending(-1, 4) == 0


@pytest.mark.parametrize("record", [None, [], {"stage": "x"}, {"stage": "x", "priority": "high", "pending": 1,
                                                                 "targets": ["a"], "at": 1.0},
                                    {"stage": "x", "priority": 1, "pending": 1, "targets": "a", "at": 1.0}])
def test_a_record_that_is_not_a_demand_is_ignored(record):
    assert Demand.from_json(record) is None


def test_demand_round_trips():
    record = demand("scan_orders", 3, 2)
    assert Demand.from_json(record.to_json()) == record


# -- the scheduler -------------------------------------------------------------------------------


def test_the_scheduler_launches_only_the_claimable_slots_and_says_why_it_waits():
    config = SpeculativeConfig().with_overrides({"targets": [{"name": "a", "slots": 2}]}, "test")
    scheduler = StageScheduler(parallelism=3, config=config)
    actions = scheduler.handle(TargetsObserved(free={"a": 0}, capacity={"a": 2}, yielded={"a": 2}), Tick(NOW))
    assert actions == [] and scheduler.originals_waiting == 3
    assert "2 free slots left to stages of the run ahead" in (scheduler.slot_status(NOW) or "")
    actions = scheduler.handle(TargetsObserved(free={"a": 1}, capacity={"a": 2}, yielded={"a": 1}), Tick(NOW + 1))
    assert len(actions) == 1 and scheduler.originals_waiting == 2 and scheduler.wants_slots
