"""slot_priority = critical_path: stage controllers of one DAG run leave free slots to the stages ahead of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.core.faults import Faults
from airflow_provider_speculative.core.priority import DEMAND_TTL, Demand
from airflow_provider_speculative.store.files import read_json, read_jsonl
from airflow_provider_speculative.store.slots import TargetSlots
from tests.factories import Clock, stage_plan, write_plan
from tests.unit.control.test_controller import FORCED, FakeBackend

# Q3's priorities on one 2-slot target (core/priority.py): scan_orders feeds the longer chain.
PRIORITIES = {"scan_customer": 3, "scan_orders": 3, "scan_lineitem": 2, "join_orders": 2, "join_lineitem": 1,
              "top": 0}


def stage(root: Path, name: str, clock: Clock, parallelism: int, targets: tuple[str, ...] = ("host",),
          faults: Faults | None = None, **config: Any) -> tuple[StageController, FakeBackend]:
    plan = stage_plan(root, stage=name, parallelism=parallelism, priorities=PRIORITIES,
                      config={"targets": [{"name": t, "slots": 2} for t in targets],
                              "slot_priority": "critical_path", **config})
    layout = write_plan(plan)
    backend = FakeBackend(layout, clock)
    return StageController.open(plan, clock=clock, backends=dict.fromkeys(targets, backend), observer=backend,
                                faults=faults), backend


def running(backend: FakeBackend) -> list[tuple[int, int]]:
    return [key for key, a in backend.attempts.items() if a.state.value == "RUNNING"]


def test_a_stage_behind_leaves_the_free_slots_to_the_stage_ahead(tmp_path):
    clock = Clock()
    orders, orders_backend = stage(tmp_path, "scan_orders", clock, parallelism=3)
    lineitem, lineitem_backend = stage(tmp_path, "scan_lineitem", clock, parallelism=4)
    # scan_lineitem steps first, but scan_orders published its 3 waiting originals when it was opened.
    lineitem.step()
    assert running(lineitem_backend) == [] and TargetSlots(tmp_path, "host").count() == 0
    assert "2 free slots left to stages of the run ahead" in lineitem.summary(clock())["slot_status"]
    orders.step()
    assert len(running(orders_backend)) == 2
    # One original of scan_orders still waits: the slot the first scan_orders attempt gives back is its.
    clock.now += 1
    orders_backend.finish(*running(orders_backend)[0])
    lineitem.step()
    assert running(lineitem_backend) == []
    orders.step()
    assert len(running(orders_backend)) == 2
    assert read_json(orders.layout.demand)["pending"] == 0
    # scan_orders launched every original: the next free slot is scan_lineitem's.
    clock.now += 1
    orders_backend.finish(*running(orders_backend)[0])
    orders.step()
    lineitem.step()
    assert len(running(lineitem_backend)) == 1
    launches = [e["stage"] for e in _launches(orders, lineitem)]
    assert launches == ["scan_orders"] * 3 + ["scan_lineitem"]


def _launches(*controllers: StageController) -> list[dict[str, Any]]:
    events = [{**e, "stage": c.layout.stage} for c in controllers for e in read_jsonl(c.layout.journal)
              if e["event"] == "launch"]
    return sorted(events, key=lambda e: e["at"])


def test_a_stage_behind_takes_what_the_stage_ahead_cannot_use(tmp_path):
    clock = Clock()
    stage(tmp_path, "scan_orders", clock, parallelism=1)
    lineitem, lineitem_backend = stage(tmp_path, "scan_lineitem", clock, parallelism=4)
    lineitem.step()
    # One original waits ahead of it: one slot is left to it, the other is scan_lineitem's at once.
    assert len(running(lineitem_backend)) == 1


def test_the_demand_of_a_crashed_controller_holds_back_nobody_for_long(tmp_path):
    clock = Clock()
    stage(tmp_path, "scan_orders", clock, parallelism=3)  # opened, then never stepped again
    lineitem, lineitem_backend = stage(tmp_path, "scan_lineitem", clock, parallelism=4)
    lineitem.step()
    assert running(lineitem_backend) == []
    clock.now += DEMAND_TTL + 1
    lineitem.step()
    assert len(running(lineitem_backend)) == 2


def test_a_stage_that_ended_withdraws_its_demand(tmp_path):
    clock = Clock()
    orders, orders_backend = stage(tmp_path, "scan_orders", clock, parallelism=1)
    orders.step()
    clock.now += 1
    orders_backend.finish(0, 0)
    orders.step()
    assert orders.result is not None
    assert Demand.from_json(read_json(orders.layout.demand)).pending == 0


def test_fifo_neither_publishes_nor_yields(tmp_path):
    clock = Clock()
    orders, _ = stage(tmp_path, "scan_orders", clock, parallelism=3, slot_priority="fifo")
    lineitem, lineitem_backend = stage(tmp_path, "scan_lineitem", clock, parallelism=4, slot_priority="fifo")
    lineitem.step()
    assert len(running(lineitem_backend)) == 2
    assert not orders.layout.demand.exists()


def test_once_its_originals_run_the_stage_ahead_holds_back_nothing(tmp_path):
    # Only originals waiting for a slot are demand: the freed slot goes to the stage behind.
    clock = Clock()
    orders, orders_backend = stage(tmp_path, "scan_orders", clock, parallelism=2)
    orders.step()
    assert len(running(orders_backend)) == 2 and read_json(orders.layout.demand)["pending"] == 0
    lineitem, lineitem_backend = stage(tmp_path, "scan_lineitem", clock, parallelism=4)
    clock.now += 1
    orders_backend.finish(0, 0)
    orders.step()
    lineitem.step()
    assert len(running(lineitem_backend)) == 1


def test_a_stage_behind_still_runs_speculative_copies_in_the_slots_left(tmp_path):
    clock = Clock()
    stage(tmp_path, "scan_orders", clock, parallelism=1, targets=("a", "b"))  # one original waits ahead
    lineitem, lineitem_backend = stage(tmp_path, "scan_lineitem", clock, parallelism=1, targets=("a", "b"),
                                       faults=FORCED, enabled=True)
    lineitem.step()
    clock.now += 1
    lineitem.step()  # the copy of the forced-slow original, on the other target
    # Four free slots, one left to scan_orders: scan_lineitem's original and its copy take two of the others.
    assert sorted(running(lineitem_backend)) == [(0, 0), (0, 1)]
    assert TargetSlots(tmp_path, "a").count() + TargetSlots(tmp_path, "b").count() == 2
    assert lineitem.scheduler.yielded == {"a": 1}
