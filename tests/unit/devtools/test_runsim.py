"""A DAG run's stages overlapping on one pool (devtools/runsim.py): slot_priority against first come, first served."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.devtools.runsim import RunScenario, RunStage, simulate_run, tpch_q3
from airflow_provider_speculative.devtools.simulator import NodeSpec
from airflow_provider_speculative.exceptions import ConfigError

# The orders in which Q3's three scans may start: a real scheduler starts them within moments of each other.
LINEITEM_FIRST = ("scan_lineitem", "scan_orders", "scan_customer")
LINEITEM_LAST = ("scan_customer", "scan_orders", "scan_lineitem")


@pytest.mark.parametrize("order", [LINEITEM_FIRST, ("scan_orders", "scan_lineitem", "scan_customer")])
def test_q3_ends_sooner_when_the_longer_chain_claims_first(order):
    fifo = simulate_run(tpch_q3(order), "fifo")
    critical = simulate_run(tpch_q3(order), "critical_path")
    # First come, first served lets scan_lineitem hold the slots join_orders' producers need: join_orders
    # starts only after it; with critical_path it starts while scan_lineitem still scans.
    assert fifo.stages["join_orders"].start > fifo.stages["scan_lineitem"].end
    assert critical.stages["join_orders"].start < critical.stages["scan_lineitem"].end
    assert critical.makespan < fifo.makespan


def test_q3_in_an_order_that_already_suits_it_is_unchanged():
    fifo = simulate_run(tpch_q3(LINEITEM_LAST), "fifo")
    critical = simulate_run(tpch_q3(LINEITEM_LAST), "critical_path")
    assert critical.stages == fifo.stages


def test_the_stages_are_the_cores_schedulers_and_the_priorities_the_plans(monkeypatch: pytest.MonkeyPatch):
    handled: set[str] = set()
    original = StageScheduler.handle

    def recording(self: StageScheduler, *stimuli: object) -> list[object]:
        handled.add(self.label.rsplit(" ", 1)[-1])
        return original(self, *stimuli)

    monkeypatch.setattr(StageScheduler, "handle", recording)
    outcome = simulate_run(tpch_q3(), "critical_path")
    assert handled == set(outcome.stages)
    assert {name: span.priority for name, span in outcome.stages.items()} == {
        "scan_customer": 3, "scan_orders": 3, "scan_lineitem": 2, "join_orders": 2, "join_lineitem": 1, "top": 0}


def test_a_run_is_deterministic_and_a_stage_starts_after_its_upstreams():
    first, second = (simulate_run(tpch_q3(LINEITEM_FIRST), "critical_path") for _ in range(2))
    assert first == second
    stages = first.stages
    assert stages["join_lineitem"].start >= max(stages["join_orders"].end, stages["scan_lineitem"].end) + 1.5 - 1e-6


def test_a_stage_behind_gets_the_slot_the_stage_ahead_cannot_use():
    # 41 subtasks ahead on 2 slots: in its last wave one original waits and the other slot is the small stage's,
    # which so ends with the large one, not after it.
    nodes = (NodeSpec("a", slots=2, cores=2.0),)
    stages = (RunStage("big", (1.0,) * 41), RunStage("small", (1.0,)), RunStage("after_big", (1.0,), ("big",)))
    outcome = simulate_run(RunScenario("starve", nodes, stages, startup=0.5), "critical_path")
    assert outcome.stages["small"].end <= outcome.stages["big"].end + 1e-6


def test_an_unknown_upstream_is_refused():
    with pytest.raises(ConfigError, match="unknown upstreams"):
        simulate_run(RunScenario("bad", (NodeSpec("a"),), (RunStage("s", (1.0,), ("nope",)),)))
