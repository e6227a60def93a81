"""Plan one stage run: the single planning path of the operator (on a worker) and the start trigger (triggerer).

Planning reads the store, lists sources, resolves targets from connections and writes ``plan.json``. It
runs where the stage starts: by default in the triggerer (``triggers/stage.py``, ``StageStartTrigger``:
no worker start and no DAG parse per stage), or on a worker in ``SparkStageOperator.execute`` (under
``dag.test()`` and with ``commit_in_triggerer=False``). Both call :class:`StagePlanner`, so the checks
and the plan are the same.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.control.controller import wipe_stage_attempts
from airflow_provider_speculative.control.kill import kill_stage
from airflow_provider_speculative.control.sources import application_path, list_sources, source_root
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.faults import current as current_faults
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, RenderedStage, SourceSpec, render_stage
from airflow_provider_speculative.core.hybrid import (
    PRODUCER_FAILED_STATES,
    PRODUCER_SKIPPED_STATES,
    commit_identity,
    producer_commit_usable,
    producer_plan_usable,
    producer_record,
)
from airflow_provider_speculative.core.paths import is_object_url
from airflow_provider_speculative.core.plan import StagePlan, plan_stage
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.exceptions import (
    PlanError,
    StageFailedError,
    StoreError,
    UpstreamFailedError,
    UpstreamSkippedError,
)
from airflow_provider_speculative.hooks.targets import connect_env_sync, resolve_targets
from airflow_provider_speculative.settings import configured_store, metadata_db_identity, stage_config
from airflow_provider_speculative.sinks.base import PlanContext, Sink
from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.store.backend import StoreBackend, StoreNotOwnedError
from airflow_provider_speculative.store.identity import claim_store, own_run, own_store
from airflow_provider_speculative.store.layout import RunNotOwnedError, StageLayout, layout_root, shown_root, store_at
from airflow_provider_speculative.store.results import broken_admissions, read_committed
from airflow_provider_speculative.store.task_state import record_task_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """What planning needs of the task instance and its DAG run (from a worker's context or a trigger's TI)."""

    dag_id: str
    run_id: str
    try_number: int
    clear_number: int
    logical_date: str | None = None
    conf: dict[str, Any] = field(default_factory=dict)
    task_id: str = ""
    run_after: str | None = None


def iso_or_none(when: Any) -> str | None:
    """A datetime as ISO-8601 (how RunInfo carries times), or None."""
    return when.isoformat() if when is not None else None


@dataclass
class HybridWait:
    """Hybrid producers without a usable plan yet: what to watch (input name -> producer stage and dir)."""

    where: str
    inputs: dict[str, dict[str, Any]]


# (config, application, stage's spark_conf, app name, where) -> each target's launch template.
TargetResolver = Callable[[SpeculativeConfig, str, dict[str, str], str, str], dict[str, dict[str, Any]]]


def airflow_connect_env(plan: StagePlan) -> dict[str, dict[str, str]]:
    """The Connect targets' URLs (tokens included) from Airflow connections, to stop a replanned stage's attempts."""
    return connect_env_sync(plan)


def airflow_targets(config: SpeculativeConfig, application: str, spark_conf: dict[str, str], app_name: str,
                    where: str) -> dict[str, dict[str, Any]]:
    """Launch templates of the config's targets from their Airflow connections (the deployed path)."""
    return resolve_targets(config, application=application, spark_conf=spark_conf, app_name=app_name, where=where)


class StagePlanner:
    """Plans one stage of a graph for one task try; every refusal names pipeline, stage and input.

    The operator and the start trigger use the deployment's config (:func:`stage_config`), the store it
    names (:func:`settings.configured_store`: a POSIX directory or an S3 root, with ``s3_conn_id``'s
    credentials) and targets from Airflow connections. The development runner (``devtools/runner.py``)
    passes its own ``config``, ``root`` and ``targets`` (local spark-submit or Connect servers) and
    shares everything else: source listing, Parquet and sink checks, and :func:`core.plan.plan_stage`.
    Every layout is built over :attr:`store` and read and written by name; ``root`` is the layouts' root
    (a POSIX directory, or a ``StorePath`` anchor naming the store's URL).
    """

    def __init__(self, graph: PipelineGraph, stage: str, *, sink: Sink | None, declared_sink: dict[str, Any] | None,
                 run: RunInfo, force_rerun: bool = False, logger: Any = None,
                 config: SpeculativeConfig | None = None, root: Path | StoreBackend | None = None,
                 targets: TargetResolver = airflow_targets, rendered: RenderedStage | None = None,
                 target_env: Callable[[StagePlan], dict[str, dict[str, str]]] = airflow_connect_env) -> None:
        # The stage's templated fields as Airflow rendered them for this run, checked as at parse time.
        self.graph = render_stage(graph, stage, rendered) if rendered is not None else graph
        self.stage = stage
        self.sink = sink
        self.declared_sink = declared_sink
        self.run = run
        self.force_rerun = force_rerun
        self.log = logger or log
        self.where = f"pipeline {graph.name!r}, stage {stage!r}"
        self.config: SpeculativeConfig = config if config is not None else stage_config(graph, stage)
        self.store: StoreBackend = store_at(root) if root is not None else configured_store(self.config)
        self.root: Path = layout_root(self.store)
        self.targets = targets
        # Resolves the secrets a Connect target needs to stop a previous plan's attempts (never stored).
        self.target_env = target_env
        self.layout = self.layout_of(stage)

    def layout_of(self, stage: str) -> StageLayout:
        """The store directory of ``stage`` (this stage or one of its pipeline's) in this DAG run."""
        return StageLayout.over(self.store, self.run.dag_id, self.run.run_id, self.graph.store_key(stage))

    def watch_entry(self, stage: str, **extra: str) -> dict[str, str]:
        """What a trigger waiting for ``stage`` needs to read it: its store root and name (and, for triggers of
        older versions, its directory), plus ``extra``; the connection id only names where credentials are."""
        layout = self.layout_of(stage)
        return {"stage": stage, "dir": str(layout.dir), "store": layout.store_root, "name": layout.name(layout.dir),
                "conn_id": self.config.s3_conn_id, **extra}

    def _committed(self, stage: str) -> Any:
        """The committed record of ``stage`` in this DAG run, or None."""
        layout = self.layout_of(stage)
        return layout.read_json(layout.committed)

    def record_state(self, state: TaskState, reason: str | None = None) -> None:
        """Record the task's state in the store (hybrid consumers read it to fail at once)."""
        fields = {"reason": reason} if reason is not None else {}
        record_task_state(self.layout, state, try_number=self.run.try_number, clear_number=self.run.clear_number,
                          **fields)

    def record_failure(self, exc: BaseException) -> None:
        """Record a planning failure; a full store must not hide the stage's own error."""
        with contextlib.suppress(StoreError):
            if not self.layout.owns_run():
                return  # a foreign root or run (start refused it): nothing of ours is written there
            self.record_state(TaskState.FAILED, reason=f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        """Own the store root and the DAG run's prefix (before their first write), record 'planning'."""
        self.claim_store()
        self.claim_run()
        self.record_state(TaskState.PLANNING)

    def claim_run(self) -> None:
        """Own the DAG run's prefix, so that every removal of the run's data is an owned delete."""
        try:
            own_run(self.layout)
        except RunNotOwnedError as exc:
            # Writing into a run that is not provably ours would later let the provider delete it.
            raise PlanError(f"{self.where}: {exc}") from None

    def claim_store(self) -> None:
        """Own the store root (refuse a foreign directory) and record which metadata database it belongs to."""
        store = self.layout.store
        identity = metadata_db_identity()
        try:
            # Without a database here (an Airflow 3 task or trigger) only the ownership marker is written.
            record = claim_store(store, identity) if identity is not None else own_store(store)
        except StoreNotOwnedError as exc:
            # Writing here would make gc treat whatever else lives there as deleted DAG runs.
            raise PlanError(f"{self.where}: {exc}") from None
        except StoreError as exc:
            self.log.warning("could not record the store's metadata database: %s", exc)
            return
        if identity is None:
            return
        recorded = (record or {}).get("metadata_db") or {}
        if recorded.get("id") != identity["id"]:
            self.log.warning("store %s belongs to metadata database %s, not this Airflow's %s: "
                             "`airflow speculative gc` here will not delete runs", shown_root(store),
                             recorded.get("url"), identity["url"])

    def speculation_blocker(self) -> str | None:
        """Why no two attempts of a subtask may run at once (a source or the sink cannot take it), or None."""
        for name, source in self.graph.stages[self.stage].inputs.items():
            if isinstance(source, SourceSpec) and not source.supports_concurrent_attempts:
                return f"source {name!r} cannot take concurrent attempts"
        if self.sink is not None and not self.sink.supports_concurrent_attempts:
            return f"sink {type(self.sink).__name__} does not implement SupportsConcurrentExecutionAttempts"
        return None

    def ancestors(self, stages: set[str]) -> set[str]:
        """``stages`` and every stage upstream of them, transitively."""
        seen: set[str] = set()
        pending = list(stages)
        while pending:
            stage = pending.pop()
            if stage not in seen:
                seen.add(stage)
                pending += self.graph.upstreams(stage)
        return seen

    def blocking_producers(self) -> list[str]:
        """Upstream stages this stage reads through a blocking exchange (it plans on their commits)."""
        spec = self.graph.stages[self.stage]
        return sorted({entry.upstream for entry in spec.inputs.values()
                       if isinstance(entry, ExchangeSpec) and entry.mode != "hybrid"})

    def commit_snapshot(self) -> dict[str, str | None]:
        """The blocking producers' commits as they are now (a consumer started in a trigger fences on them)."""
        return {p: commit_identity(self._committed(p)) for p in self.blocking_producers()}

    def uncommitted_producers(self, airflow_states: dict[str, str | None] | None = None,
                              seen_at_start: dict[str, str | None] | None = None) -> list[str]:
        """Blocking producers without a commit this stage may plan on yet (empty: plan now).

        ``airflow_states`` (producer task -> Airflow state, when known) ends the wait: a failed producer
        raises :class:`UpstreamFailedError`, a skipped one :class:`UpstreamSkippedError`, both naming it,
        and ``success`` accepts the producer's commit. ``seen_at_start`` (:meth:`commit_snapshot` when the
        stage started) marks commits that may be stale: a clear of the producer with its downstream starts
        this stage again while the producer's previous commit is still in the store.
        """
        states = airflow_states or {}
        seen = seen_at_start or {}
        waiting = []
        for producer in self.blocking_producers():
            state = states.get(producer)
            if state in PRODUCER_FAILED_STATES:
                raise UpstreamFailedError(f"{self.where}: producer stage {producer!r} is {state}; this stage, "
                                          "which was waiting for its commit, fails with it (clear the producer "
                                          "with its downstream to rerun both)")
            if state in PRODUCER_SKIPPED_STATES:
                raise UpstreamSkippedError(f"{self.where}: producer stage {producer!r} was skipped")
            committed = self._committed(producer)
            if state == "success" and committed is None:
                # A producer commits before its task succeeds; without a commit it was marked success by hand.
                raise UpstreamFailedError(f"{self.where}: producer stage {producer!r} is success in Airflow but has "
                                          f"no committed result at {self.layout_of(producer).committed} (marked "
                                          "success by hand?); clear it to run it")
            if not producer_commit_usable(committed, self.run.clear_number, state, seen.get(producer)):
                waiting.append(producer)
        return waiting

    def hybrid_inputs(self) -> dict[str, dict[str, Any]] | HybridWait:
        """Producer records of the hybrid inputs (plan-shaped), or what is still missing.

        Raises :class:`StageFailedError` naming pipeline, stage and input when a producer failed or nothing
        upstream changed for ``hybrid_input_timeout``.
        """
        spec = self.graph.stages[self.stage]
        records: dict[str, dict[str, Any]] = {}
        watch: dict[str, dict[str, Any]] = {}
        for name, entry in spec.inputs.items():
            if not isinstance(entry, ExchangeSpec) or entry.mode != "hybrid":
                continue
            producer = self.layout_of(entry.upstream)
            plan = producer.read_json(producer.plan)
            usable, failure = producer_plan_usable(plan, producer.read_json(producer.task_state),
                                                   producer.read_json(producer.committed), self.run.clear_number)
            if failure:
                raise StageFailedError(f"{self.where}, input {name!r}: hybrid producer stage {entry.upstream!r} "
                                       f"{failure}")
            if usable and plan is not None:
                records[entry.upstream] = producer_record(plan)
            else:
                watch[name] = self.watch_entry(entry.upstream)
        if not watch:
            return records
        marker = self.layout.read_json(self.layout.hybrid_wait) or {}
        key = {"clear_number": self.run.clear_number, "try_number": self.run.try_number}
        if {k: marker.get(k) for k in key} != key:
            marker = {**key, "since": time.time()}
            self.layout.replace_json(self.layout.hybrid_wait, marker)
        # A producer that has not planned yet may itself wait for its own upstreams (blocking or not):
        # fail when one of them failed, and time out only when nothing upstream changed for that long.
        upstream_stages = self.ancestors({w["stage"] for w in watch.values()})
        for stage in sorted(upstream_stages):
            upstream = self.layout_of(stage)
            _, failure = producer_plan_usable(None, upstream.read_json(upstream.task_state), None,
                                              self.run.clear_number)
            if failure:
                names = ", ".join(f"{n!r} ({w['stage']})" for n, w in watch.items())
                raise StageFailedError(f"{self.where}, input {names}: upstream stage {stage!r} of the hybrid "
                                       f"producer {failure}")
        last_change = max([float(marker["since"]), *(_last_change(self.layout_of(stage))
                                                     for stage in upstream_stages)])
        if time.time() - last_change > self.config.hybrid_input_timeout:
            missing = ", ".join(f"{n!r} ({w['stage']})" for n, w in watch.items())
            raise StageFailedError(f"{self.where}, input {missing}: no usable plan of the hybrid producer stage, "
                                   f"and nothing upstream of it changed for {self.config.hybrid_input_timeout:g}s "
                                   "(hybrid_input_timeout); did it start?")
        return HybridWait(self.where, watch)

    def application(self) -> str:
        """The stage's application (rendered) made absolute and checked to exist; PlanError naming the stage."""
        return application_path(self.graph.stages[self.stage].application, self.where)

    def validate_sink(self) -> None:
        """Before any compute: a sink that would overwrite the store, a source or another stage's output."""
        if self.sink is None:
            return
        spec = self.graph.stages[self.stage]
        self.sink.validate_plan(PlanContext(
            dag_id=self.run.dag_id, run_id=self.run.run_id, stage=self.layout.stage,
            where=f"{self.where}, sink {type(self.sink).__name__}", store_root=self.layout.root,
            # A local sink cannot overlap an object-store source: only local sources are compared.
            source_paths=tuple(source_root(src) for src in spec.inputs.values()
                               if isinstance(src, SourceSpec) and not is_object_url(src.path)),
            declared=self.declared_sink))

    def decide(self, hybrid: dict[str, dict[str, Any]]) -> StagePlan:
        """Decide the plan from sources and committed upstreams (checks included); writes nothing.

        Faults a test injects into this stage (core/faults.py) must name its targets: checked here, where the
        targets are first known.
        """
        spec = self.graph.stages[self.stage]
        application = self.application()
        source_files = list_sources(spec, self.where, self.config.s3_conn_id)
        self.validate_sink()
        # A hybrid producer is planned on its plan (always, so a retry plans the same ranges), others on commits.
        upstream = {name: hybrid[name] if name in hybrid else read_committed(self.layout_of(name))
                    for name in self.graph.upstreams(self.stage)}
        plan = plan_stage(
            self.graph, self.stage, self.config, source_files=source_files, upstream_committed=upstream,
            sink=self.sink.to_json() if self.sink is not None else None,
            speculation_blocker=self.speculation_blocker(),
            context={"dag_id": self.run.dag_id, "run_id": self.run.run_id, "store_root": self.layout.store_root,
                     "logical_date": self.run.logical_date, "application": application,
                     "try_number": self.run.try_number, "clear_number": self.run.clear_number,
                     "task_id": self.run.task_id, "run_after": self.run.run_after,
                     **({"store_prefix": self.graph.store_prefix} if self.graph.store_prefix else {}),
                     "targets": self.targets(self.config, application, spec.spark_conf,
                                             f"{self.run.dag_id}.{self.layout.stage}", self.where)})
        current_faults().of_stage(self.run.dag_id, self.layout.stage).check_targets(plan["targets"], self.where)
        return plan

    def plan(self, hybrid: dict[str, dict[str, Any]]) -> StagePlan:
        """Decide the plan, reconcile it with a previous plan of this stage run, write plan.json."""
        plan = self.decide(hybrid)
        layout = self.layout
        previous = layout.read_json(layout.plan)
        force = self.force_rerun or bool(self.run.conf.get("speculative_force_rerun"))
        if force or (previous and previous.get("fingerprint") != plan["fingerprint"]):
            if previous:
                kill_stage(previous, "full rerun forced" if force else "stage replanned",
                           target_env=self.target_env(previous))
            wipe_stage_attempts(layout)
        elif previous:
            # A retried or cleared task reruns only subtasks without a valid committed result.
            observer = attempt_observer(layout)
            for subtask, attempt, reason in broken_admissions(layout, plan["parallelism"]):
                observer.invalidate(subtask, attempt, f"committed output no longer valid: {reason}")
                journals.record_stage(layout, Event.INVALIDATE, subtask=subtask, attempt=attempt, reason=reason)
        layout.replace_json(layout.plan, plan)
        journals.record_stage(layout, Event.PLAN_DECIDED, parallelism=plan["parallelism"],
                              decision=plan["parallelism_decision"])
        for warning in plan["warnings"]:
            self.log.warning("stage %s: %s", self.stage, warning)
            journals.record_stage(layout, Event.PLAN_WARNING, message=warning)
        self.log.info("stage %s: %d subtasks, speculation %s, plan %s", self.stage, plan["parallelism"],
                      "blocked: " + plan["speculation_blocker"] if plan["speculation_blocker"] else
                      ("enabled" if self.config.enabled else "disabled"), layout.plan)
        self.record_state(TaskState.DEFERRED)
        return plan


def _last_change(layout: StageLayout) -> float:
    """When anything of a stage run last changed in the store (its journal, summary or task state)."""
    times = [0.0]
    for path in (layout.journal, layout.summary, layout.task_state):
        with contextlib.suppress(StoreError):
            info = layout.store.stat(layout.name(path))
            if info is not None:
                times.append(info.mtime)
    return max(times)

