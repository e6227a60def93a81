"""What one stage run asks of its store, counted on the in-memory double standing for S3: a regression guard."""

from __future__ import annotations

from collections import Counter

from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import Clock, stage_plan
from tests.unit.control.test_planning_store import ByNameBackend
from tests.unit.store.memory import MemoryBackend

S3_ROOT = "s3://lake/ops"
TARGETS = [{"name": "local-a", "slots": 64}, {"name": "local-b", "slots": 64}]


class Attempts(ByNameBackend):
    """Fake attempts whose manifests are written by name, as an attempt on S3 writes them."""

    def finish(self, subtask: int, attempt: int) -> None:
        """Finish with a manifest written through the stage's store."""
        self.layout.replace_json(self.layout.manifest(subtask, attempt), {"files": [], "records": 0})
        self.set(subtask, attempt, AttemptState.FINISHED)


def run_stage(store: MemoryBackend, parallelism: int) -> dict[str, Counter[tuple[str, str]]]:
    """One stage from plan written to commit; the requests of each phase."""
    phases: dict[str, Counter[tuple[str, str]]] = {}

    def phase(name: str) -> None:
        phases[name] = store.ops.copy()
        store.ops.clear()

    plan = stage_plan(S3_ROOT, parallelism=parallelism, config={"targets": TARGETS})
    layout = StageLayout.of_plan(plan)
    layout.claim_run()
    layout.replace_json(layout.plan, plan)
    store.ops.clear()
    clock = Clock()
    backend = Attempts(layout, clock)
    controller = StageController.open(plan, clock=clock, backends={"local-a": backend, "local-b": backend},
                                      observer=backend)
    phase("open")
    clock.now += 1
    controller.step()
    phase("first step")
    assert len(backend.launched) == parallelism
    clock.now += 1
    controller.step()
    phase("running step")
    for subtask in range(parallelism):
        clock.now += 1
        backend.finish(subtask, 0)
        controller.step()
        assert not controller.done or subtask == parallelism - 1
    phase("admit and commit")
    assert controller.done and controller.succeeded
    return phases


def test_a_stage_run_costs_store_requests_linear_in_its_subtasks() -> None:
    """Plan written to commit on S3 (each request an HTTP call): bounded per subtask, an idle step bounded flat."""
    totals: dict[int, int] = {}
    for parallelism in (8, 16):
        roots.forget_stores()
        memory = MemoryBackend(S3_ROOT)
        roots.install_store(memory)
        try:
            phases = run_stage(memory, parallelism)
        finally:
            roots.forget_stores()
        every: Counter[tuple[str, str]] = sum(phases.values(), Counter())
        totals[parallelism] = sum(every.values())
        # Per subtask: a launch claims a slot (list, create, list) and an attempt; an admission releases it.
        assert totals[parallelism] <= 19 * parallelism + 20
        assert sum(phases["open"].values()) <= parallelism + 8
        assert sum(phases["first step"].values()) <= 6 * parallelism + 8
        assert sum(phases["admit and commit"].values()) <= 10 * parallelism + 8
        # A step in which nothing changed: flat, whatever the stage's size.
        assert sum(phases["running step"].values()) <= 6
        # plan.json is written once and handed to the controller: never read back on the way.
        assert every[("read", "d/r/scan/plan.json")] == 0
        # A fresh stage has no admission to restore: its markers are not read at open.
        assert not any(kind == "read" and name.endswith("/admitted.json") for kind, name in phases["open"])
        # The shared blocklist is read once per step at most (none of ours to merge here).
        steps = parallelism + 2
        assert every[("read", "d/r/blocklist.json")] <= steps + 1
    assert totals[16] <= 2 * totals[8]
