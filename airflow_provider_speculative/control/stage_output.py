"""Find a stage run's committed output in the store by DAG, stage and logical date (StageOutputSensor's I/O).

A run is found by its logical date, not by a guessed run id: run ids depend on how the run was
created (``scheduled__``, ``manual__``, asset-triggered, a custom id), while every stage's plan.json
records the run's ``logical_date``. Scanning costs one small JSON read per run directory of that
DAG, and only once per directory: a run's logical date never changes, so directories already seen
with another date are skipped on later polls (cost linear in the DAG's runs, then in new runs).

Every read goes by name through the store's backend: a POSIX root, or an ``s3://bucket/prefix`` root opened
through ``store/roots.py`` with the credentials of connection ``conn_id`` (``[speculative] s3_conn_id``) where
the Airflow layer resolves connections, else the AWS environment. The backend is opened on the first look, in
the thread that looks (a first open may read an Airflow connection, which a triggerer's event loop must not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_speculative.core.readiness import Readiness, check_committed, describe_wait, same_instant
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.exceptions import NotFoundError, StoreError
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import PLAN_FILE, StageLayout, safe_component, stage_key
from airflow_provider_speculative.store.roots import is_s3_root, open_store

# The longest failure reason of a stage task a sensor's message quotes.
MAX_REASON = 300


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

    def __init__(self, store_root: str | Path | StoreBackend, dag_id: str, stage: str, *, logical_date: Any = None,
                 run_id: str | None = None, subtasks: Sequence[int] | None = None,
                 subpartitions: Sequence[int] | None = None, conn_id: str = "") -> None:
        if (logical_date is None) == (run_id is None):
            raise ValueError(f"DAG {dag_id!r}, stage {stage!r}: give exactly one of logical_date and run_id")
        # A POSIX root as a Path; an object store's root by its URL (str(Path) would mangle "s3://").
        self.root: str | Path | StoreBackend = store_root if isinstance(store_root, StoreBackend) or \
            is_s3_root(store_root) else Path(store_root)
        self.conn_id = conn_id
        self._store: StoreBackend | None = store_root if isinstance(store_root, StoreBackend) else None
        self.dag_id, self.stage = dag_id, stage
        self.logical_date, self.run_id = logical_date, run_id
        self.subtasks = list(subtasks) if subtasks is not None else None
        self.subpartitions = list(subpartitions) if subpartitions is not None else None
        self._other_dates: set[str] = set()  # run directories of other logical dates (never rescanned)

    @property
    def store(self) -> StoreBackend:
        """The watched store's backend, opened on first use (module docstring)."""
        if self._store is None:
            root = self.root
            self._store = root if isinstance(root, StoreBackend) else open_store(root, conn_id=self.conn_id)
        return self._store

    def _layout(self, run_id: str, stage: str) -> StageLayout:
        return StageLayout.over(self.store, self.dag_id, run_id, stage)

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

    @staticmethod
    def _failed_try(layout: StageLayout) -> str:
        """What to add when the stage task's last try failed or was stopped: the sensor still waits (a retry or a
        clear may commit), but its log says why nothing comes."""
        task: Any = None
        with contextlib.suppress(StoreError):  # a torn task.json says nothing; looked at again next poll
            task = layout.read_json(layout.task_state)
        if not isinstance(task, dict) or task.get("state") not in (TaskState.FAILED, TaskState.KILLED):
            return ""
        # Written by the stage's operator, shown in a log line: one bounded line.
        reason = " ".join(str(task.get("reason") or "no reason recorded").split())
        shown = reason[:MAX_REASON] + ("..." if len(reason) > MAX_REASON else "")
        return f"; its last try {task['state']}: {shown}"

    def _candidates(self) -> list[tuple[str, StageLayout]]:
        if self.run_id is not None:
            run_dir = f"{safe_component(self.dag_id)}/{safe_component(self.run_id)}"
            return [(self.run_id, self._layout(self.run_id, self._stage_key(run_dir)))]
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
            found.append((run_id, self._layout(run_id, self._stage_key(run_dir))))
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
        elif not readiness.committed:
            message += self._failed_try(layout)
        return OutputObservation(run_id=run_id, readiness=readiness, message=message,
                                 committed_path=str(layout.committed) if readiness.committed else None)
