"""Slot demand of the stage runs of one DAG run: ``<run>/<stage>/demand.json`` (``slot_priority = critical_path``).

A stage run waiting for slots publishes :class:`~airflow_provider_speculative.core.priority.Demand` in its own
directory; a stage run of lower priority reads the demand of the stages ahead of it before it claims
(core/priority.py decides what it may claim). The plan names every stage of the pipeline with its priority,
so a reader reads by name exactly the records of the stages ahead of it: no listing, nothing read for
stages at or below its priority, and nothing read at all unless it wants a slot and one is free.

Writes: one when the published pending count changes (it is bounded by the targets' capacity, so a large
stage's count changes only in its last wave) and one every ``DEMAND_REFRESH`` while it is not 0; the
record lives and goes with the stage run's directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_speculative.core.priority import DEMAND_REFRESH, Demand
from airflow_provider_speculative.store.layout import StageLayout, stage_key


class DemandBoard:
    """One stage run's demand record, and the records of the stages of its DAG run ahead of it."""

    def __init__(self, layout: StageLayout, plan: Mapping[str, Any], targets: tuple[str, ...]) -> None:
        priorities = {str(k): v for k, v in (plan.get("priorities") or {}).items()}
        self.layout = layout
        self.stage = str(plan["stage"])
        self.targets = targets
        self.priority = float(priorities.get(self.stage, 0))
        # Read by name, highest priority first: the stages this one may have to yield to.
        self.ahead = [StageLayout(layout.root, layout.dag_id, layout.run_id, stage_key(plan, name), layout.store)
                      for name, p in sorted(priorities.items(), key=lambda kv: (-float(kv[1]), kv[0]))
                      if name != self.stage and float(p) > self.priority]
        # Some stage may yield to this one: only then is its demand worth a write.
        self.behind = any(float(p) < self.priority for name, p in priorities.items() if name != self.stage)
        self._published: tuple[int, float] | None = None
        self._read: tuple[float, list[Demand]] | None = None

    def publish(self, pending: int, now: float) -> bool:
        """Write the demand if it changed, or every ``DEMAND_REFRESH`` while not 0; True if written."""
        if not self.behind:
            return False
        last = self._published
        if last is not None and last[0] == pending and (pending == 0 or now - last[1] < DEMAND_REFRESH):
            return False
        if last is None and pending == 0:
            return False  # nothing published yet: nothing to withdraw
        record = Demand(self.stage, self.priority, pending, self.targets, now)
        self.layout.replace_json(self.layout.demand, record.to_json())
        self._published = (pending, now)
        return True

    def read(self, now: float) -> list[Demand]:
        """The demand records of the stages ahead of this one (read once per ``now``; unreadable ones left out)."""
        if self._read is not None and self._read[0] == now:
            return self._read[1]
        demands = [d for layout in self.ahead if (d := Demand.from_json(layout.read_json(layout.demand))) is not None]
        self._read = (now, demands)
        return demands
