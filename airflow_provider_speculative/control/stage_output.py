"""Find a stage run's committed output in the store by DAG, stage and logical date (StageOutputSensor's I/O).

A run is found by its logical date, not by a guessed run id: run ids depend on how the run was
created (``scheduled__``, ``manual__``, asset-triggered, a custom id), while every stage's plan.json
records the run's ``logical_date``. Scanning costs one small JSON read per run directory of that
DAG, and only once per directory: a run's logical date never changes, so directories already seen
with another date are skipped on later polls (cost linear in the DAG's runs, then in new runs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.readiness import Readiness, check_committed, describe_wait, same_instant
from airflow_provider_speculative.exceptions import NotFoundError, StoreError
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.layout import PLAN_FILE, StageLayout, safe_component, stage_key


@dataclass(frozen=True)
class OutputObservation:
    """One look at the store: the matching run (if any), its readiness, and a sentence for logs and timeouts."""

    run_id: str | None
    readiness: Readiness | None
    message: str
    committed_path: str | None = None

    @property
    def ready(self) -> bool:
        """The requested output is committed."""
        return self.readiness is not None and self.readiness.ready

    def payload(self) -> dict[str, Any]:
        """JSON-able summary for a trigger event or an XCom."""
        return {"run_id": self.run_id, "committed": self.committed_path, "message": self.message,
                "ready": self.ready}


class StageOutputLocator:
    """Watch ``<store>/<dag_id>/<run>/<stage>/committed.json`` of the run with ``logical_date`` (or ``run_id``)."""

    def __init__(self, store_root: str | Path, dag_id: str, stage: str, *, logical_date: Any = None,
                 run_id: str | None = None, subtasks: Sequence[int] | None = None,
                 subpartitions: Sequence[int] | None = None) -> None:
        if (logical_date is None) == (run_id is None):
            raise ValueError(f"DAG {dag_id!r}, stage {stage!r}: give exactly one of logical_date and run_id")
        self.root = Path(store_root)
        self.store = PosixBackend(self.root)
        self.dag_id, self.stage = dag_id, stage
        self.logical_date, self.run_id = logical_date, run_id
        self.subtasks = list(subtasks) if subtasks is not None else None
        self.subpartitions = list(subpartitions) if subpartitions is not None else None
        self._other_dates: set[str] = set()  # run directories of other logical dates (never rescanned)

    def _subdirs(self, prefix: str) -> list[str]:
        """Names of the sub-prefixes right below ``prefix`` (one listing), in name order."""
        return sorted(entry[:-1] for entry in self.store.children(prefix) if entry.endswith("/"))

    def _plan_of_run(self, run_dir: str) -> dict[str, Any] | None:
        """The stage's plan.json, or a sibling stage's (any stage's plan carries the run's logical date)."""
        own: dict[str, Any] | None = self.store.read_json(f"{run_dir}/{safe_component(self.stage)}/{PLAN_FILE}")
        if own is not None:
            return own
        for child in self._subdirs(run_dir):
            plan: dict[str, Any] | None = self.store.read_json(f"{run_dir}/{child}/{PLAN_FILE}")
            if plan is not None:
                return plan
        return None

    def _stage_key(self, run_dir: str) -> str:
        """The store key of the watched stage in ``run_dir``: ``stage`` itself (a stage name or a task id), or
        the task id of the one pipeline compiled as a TaskGroup that has a stage of that name.

        NotFoundError naming the candidates when several grouped pipelines of the DAG have one.
        """
        if self.store.exists(f"{run_dir}/{safe_component(self.stage)}/{PLAN_FILE}"):
            return self.stage
        named = []
        for child in self._subdirs(run_dir):
            plan: Any = None
            with contextlib.suppress(StoreError):  # a torn or foreign file is looked at again next poll
                plan = self.store.read_json(f"{run_dir}/{child}/{PLAN_FILE}")
            if isinstance(plan, dict) and plan.get("stage") == self.stage and plan.get("store_prefix"):
                named.append(stage_key(plan))
        if len(named) > 1:
            raise NotFoundError(f"DAG {self.dag_id!r}, stage {self.stage!r}: ambiguous, pipelines compiled as task "
                                f"groups each have a stage of that name ({', '.join(named)}); give the stage as "
                                "its task id")
        return named[0] if named else self.stage

    def _candidates(self) -> list[tuple[str, StageLayout]]:
        if self.run_id is not None:
            run_dir = f"{safe_component(self.dag_id)}/{safe_component(self.run_id)}"
            return [(self.run_id, StageLayout(self.root, self.dag_id, self.run_id, self._stage_key(run_dir)))]
        dag_dir = safe_component(self.dag_id)
        found: list[tuple[str, StageLayout]] = []
        for run_name in self._subdirs(dag_dir):
            if run_name in self._other_dates:
                continue
            run_dir = f"{dag_dir}/{run_name}"
            try:
                plan = self._plan_of_run(run_dir)
            except StoreError:
                continue  # a torn or foreign file is not this run's plan; looked at again next poll
            if plan is None:
                continue  # nothing planned in that run yet: its date is unknown, look again next poll
            if not same_instant(plan.get("logical_date"), self.logical_date):
                self._other_dates.add(run_name)
                continue
            run_id = str(plan.get("run_id") or run_name)
            found.append((run_id, StageLayout(self.root, self.dag_id, run_id, self._stage_key(run_dir))))
        return found

    def check(self) -> OutputObservation:
        """Look once. Of several runs with the date (a run deleted, recreated) prefer a ready one, then the newest."""
        best: tuple[str, StageLayout, Readiness] | None = None
        for run_id, layout in self._candidates():
            record = layout.read_json(layout.committed)
            readiness = check_committed(record, self.subtasks, self.subpartitions)
            rank = (readiness.ready, readiness.committed, readiness.details.get("committed_at") or 0)
            if best is None or rank > (best[2].ready, best[2].committed, best[2].details.get("committed_at") or 0):
                best = (run_id, layout, readiness)
        if best is None:
            message = describe_wait(self.dag_id, self.stage, self.logical_date, None, None)
            return OutputObservation(run_id=None, readiness=None, message=message)
        run_id, layout, readiness = best
        date = self.logical_date if self.run_id is None else None
        message = describe_wait(self.dag_id, self.stage, date, run_id, readiness, self.subtasks, self.subpartitions)
        if readiness.ready:
            message = f"DAG {self.dag_id!r}, stage {self.stage!r}, run {run_id!r}: committed output is there"
        return OutputObservation(run_id=run_id, readiness=readiness, message=message,
                                 committed_path=str(layout.committed) if readiness.committed else None)
