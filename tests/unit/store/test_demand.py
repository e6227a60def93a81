"""Slot demand records of a DAG run's stage runs (store/demand.py) on a store that counts its requests."""

from __future__ import annotations

from typing import Any

from airflow_provider_speculative.core.priority import DEMAND_REFRESH, Demand
from airflow_provider_speculative.store.demand import DemandBoard
from airflow_provider_speculative.store.layout import StageLayout
from tests.unit.store.memory import MemoryBackend

PRIORITIES = {"scan_customer": 3, "scan_orders": 3, "scan_lineitem": 2, "join_orders": 2, "join_lineitem": 1,
              "top": 0}


def board(store: MemoryBackend, stage: str, **plan: Any) -> DemandBoard:
    layout = StageLayout.over(store, "q3", "r1", plan.get("store_prefix", "") + stage)
    return DemandBoard(layout, {"stage": stage, "priorities": PRIORITIES, **plan}, ("a", "b"))


def test_a_stage_reads_by_name_only_the_demand_of_the_stages_ahead_of_it():
    store = MemoryBackend()
    orders, lineitem = board(store, "scan_orders"), board(store, "scan_lineitem")
    customer = board(store, "scan_customer")
    assert orders.publish(4, 10.0) and customer.publish(2, 10.0)
    reads, listings = store.reads, store.listings
    assert {d.stage: d.pending for d in lineitem.read(11.0)} == {"scan_customer": 2, "scan_orders": 4}
    # Two stages are ahead of scan_lineitem: two reads by name, no listing; again at the same time, nothing.
    assert (store.reads - reads, store.listings - listings) == (2, 0)
    lineitem.read(11.0)
    assert store.reads - reads == 2
    # Nobody is ahead of scan_orders: it reads nothing.
    assert orders.ahead == [] and orders.read(12.0) == []


def test_a_demand_is_written_when_it_changes_and_refreshed_while_pending():
    store = MemoryBackend()
    orders = board(store, "scan_orders")
    assert orders.publish(4, 10.0)
    writes = store.writes
    assert not orders.publish(4, 11.0) and store.writes == writes
    assert orders.publish(4, 10.0 + DEMAND_REFRESH)  # still waiting: its record stays fresh
    assert orders.publish(0, 21.0)  # it launched everything: the record says so
    assert not orders.publish(0, 21.0 + 10 * DEMAND_REFRESH)
    record = Demand.from_json(store.read_json("q3/r1/scan_orders/demand.json"))
    assert record == Demand("scan_orders", 3.0, 0, ("a", "b"), 21.0)


def test_nothing_is_written_without_a_stage_behind_or_anything_to_withdraw():
    store = MemoryBackend()
    # The lowest-priority stage: no stage yields to it, so its demand is never written.
    assert not board(store, "top").publish(1, 10.0)
    assert not board(store, "scan_orders").publish(0, 10.0)
    assert store.writes == 0


def test_a_task_group_pipeline_reads_its_own_stages():
    store = MemoryBackend()
    board(store, "scan_orders", store_prefix="p1.").publish(4, 10.0)
    board(store, "scan_orders").publish(1, 10.0)  # the same stage name in the DAG's other pipeline
    assert [d.pending for d in board(store, "scan_lineitem", store_prefix="p1.").read(11.0)] == [4]


def test_an_unreadable_record_is_left_out():
    store = MemoryBackend()
    store.replace_json("q3/r1/scan_orders/demand.json", {"stage": "scan_orders", "pending": "many"})
    assert board(store, "scan_lineitem").read(11.0) == []
