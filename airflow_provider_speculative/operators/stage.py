"""SparkStageOperator: plans a stage run, defers once to the controller trigger, then finalizes."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_speculative.backends.registry import attempt_observer
from airflow_provider_speculative.control.commit import admitted_of, commit_admitted, commit_summary, remove_losers
from airflow_provider_speculative.control.controller import StageController, wipe_stage_attempts
from airflow_provider_speculative.control.sources import application_path, list_sources, source_root
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.graph import ExchangeSpec, PipelineGraph, SourceSpec
from airflow_provider_speculative.core.hybrid import producer_plan_usable, producer_record
from airflow_provider_speculative.core.plan import plan_stage
from airflow_provider_speculative.core.readiness import partition_key
from airflow_provider_speculative.exceptions import PlanError, StageFailedError, StoreError
from airflow_provider_speculative.hooks.targets import resolve_targets
from airflow_provider_speculative.links import SparkHistoryLink, StageViewLink
from airflow_provider_speculative.metrics import StageMetrics
from airflow_provider_speculative.settings import airflow_config, metadata_db_identity, store_root
from airflow_provider_speculative.sinks.base import AttemptResult, FinalizationContext, PlanContext, Sink, StagingScope
from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.store.files import atomic_write_json, read_json
from airflow_provider_speculative.store.identity import StoreNotOwnedError, claim_store, own_store
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import (
    broken_admissions,
    read_committed,
)
from airflow_provider_speculative.store.task_state import record_task_state
from airflow_provider_speculative.triggers.controller import StageControllerTrigger
from airflow_provider_speculative.triggers.hybrid import HybridInputsTrigger

# A hybrid consumer waits for its producers' plans in a trigger for this long at a time, then
# reschedules: under dag.test() (one task at a time) a consumer picked before its producer must give
# way, and a real scheduler only pays one short worker run per window.
HYBRID_WAIT_WINDOW = 20.0


class SparkStageOperator(BaseOperator):
    """One stage of a speculative pipeline: N subtasks, each attempt a Spark submission.

    Built by :class:`~airflow_provider_speculative.pipeline.Pipeline`; not usually instantiated by hand.
    """

    template_fields = ("sink_args",)
    operator_extra_links = (StageViewLink(), SparkHistoryLink())
    ui_color = "#f4a460"

    def __init__(self, *, graph: PipelineGraph, stage: str, sink: Sink | None = None,
                 force_rerun: bool = False, asset_partitioned: bool = False, commit_in_triggerer: bool = True,
                 **kwargs: Any) -> None:
        self.sink_asset = sink_asset(sink)
        if self.sink_asset is not None:
            outlets = kwargs.get("outlets") or []
            outlets = list(outlets) if isinstance(outlets, list | tuple) else [outlets]
            kwargs["outlets"] = [*outlets, self.sink_asset] if self.sink_asset not in outlets else outlets
        super().__init__(**kwargs)
        self.graph = graph
        self.stage = stage
        self.sink = sink
        self.sink_args = sink.describe() if sink is not None else None
        self.force_rerun = force_rerun
        self.asset_partitioned = asset_partitioned
        self.commit_in_triggerer = commit_in_triggerer

    # -- planning (worker) ------------------------------------------------------------------

    def _config(self) -> SpeculativeConfig:
        spec = self.graph.stages[self.stage]
        return (airflow_config()
                .with_overrides(self.graph.config, f"pipeline {self.graph.name!r}")
                .with_overrides(spec.config, f"stage {self.stage!r}"))

    def _layout(self, config: SpeculativeConfig, dag_id: str, run_id: str, stage: str | None = None) -> StageLayout:
        return StageLayout(store_root(config), dag_id, run_id, stage or self.stage)

    def _speculation_blocker(self) -> str | None:
        spec = self.graph.stages[self.stage]
        for name, source in spec.inputs.items():
            if isinstance(source, SourceSpec) and not source.supports_concurrent_attempts:
                return f"source {name!r} cannot take concurrent attempts"
        if self.sink is not None and not self.sink.supports_concurrent_attempts:
            return (f"sink {type(self.sink).__name__} does not implement SupportsConcurrentExecutionAttempts")
        return None

    def execute(self, context: Any) -> Any:
        """Resolve the plan, write plan.json, and defer to the stage controller (recording the task's state)."""
        config = self._config()
        layout = self._layout(config, context["dag"].dag_id, context["run_id"])
        # Before the first write into the store: a foreign directory gets nothing of ours.
        self._claim_store(layout.root, f"pipeline {self.graph.name!r}, stage {self.stage!r}")
        record_task_state(layout, "planning", try_number=context["ti"].try_number,
                          clear_number=_clear_number(context))
        try:
            return self._plan_and_defer(context, config)
        except Exception as exc:
            # Hybrid consumers of this stage read this to fail at once instead of waiting (core/hybrid.py).
            with contextlib.suppress(StoreError):  # a full store must not hide the stage's own error
                record_task_state(layout, "failed", try_number=context["ti"].try_number,
                                  clear_number=_clear_number(context), reason=f"{type(exc).__name__}: {exc}")
            raise

    def resume_after_inputs(self, context: Any, event: dict[str, Any]) -> Any:
        """The hybrid producers' plans are there (plan now), or not yet (reschedule), or one failed."""
        status = (event or {}).get("status")
        if status == "failed":
            layout = self._layout(self._config(), context["dag"].dag_id, context["run_id"])
            record_task_state(layout, "failed", try_number=context["ti"].try_number,
                              clear_number=_clear_number(context), reason=event.get("reason"))
            raise StageFailedError(event.get("reason") or f"pipeline {self.graph.name!r}, stage {self.stage!r}: "
                                                          "a hybrid producer failed")
        if status == "waiting":
            from airflow.sdk.exceptions import AirflowRescheduleException
            from airflow.sdk.timezone import utcnow

            raise AirflowRescheduleException(utcnow())
        return self.execute(context)

    def _hybrid_inputs(self, config: SpeculativeConfig, context: Any) -> dict[str, dict[str, Any]] | None:
        """Producer records of the hybrid inputs (plan-shaped), or None after deferring to wait for their plans.

        Raises :class:`StageFailedError` naming pipeline, stage and input when a producer failed or the
        wait exceeded ``hybrid_input_timeout``.
        """
        spec = self.graph.stages[self.stage]
        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        clear_number = _clear_number(context)
        where = f"pipeline {self.graph.name!r}, stage {self.stage!r}"
        records: dict[str, dict[str, Any]] = {}
        watch: dict[str, dict[str, Any]] = {}
        for name, entry in spec.inputs.items():
            if not isinstance(entry, ExchangeSpec) or entry.mode != "hybrid":
                continue
            producer = self._layout(config, dag_id, run_id, entry.upstream)
            plan = read_json(producer.plan)
            usable, failure = producer_plan_usable(plan, read_json(producer.dir / "task.json"),
                                                   read_json(producer.committed), clear_number)
            if failure:
                raise StageFailedError(f"{where}, input {name!r}: hybrid producer stage {entry.upstream!r} {failure}")
            if usable and plan is not None:
                records[entry.upstream] = producer_record(plan)
            else:
                watch[name] = {"stage": entry.upstream, "dir": str(producer.dir)}
        if not watch:
            return records
        layout = self._layout(config, dag_id, run_id)
        marker = read_json(layout.dir / "hybrid_wait.json") or {}
        key = {"clear_number": clear_number, "try_number": context["ti"].try_number}
        if {k: marker.get(k) for k in key} != key:
            marker = {**key, "since": time.time()}
            atomic_write_json(layout.dir / "hybrid_wait.json", marker)
        # A producer that has not planned yet may itself wait for its own upstreams (blocking or not):
        # fail when one of them failed, and time out only when nothing upstream changed for that long.
        upstream_stages = self._ancestors({w["stage"] for w in watch.values()})
        for stage in sorted(upstream_stages):
            _, failure = producer_plan_usable(None, read_json(self._layout(config, dag_id, run_id, stage).dir
                                                               / "task.json"), None, clear_number)
            if failure:
                names = ", ".join(f"{n!r} ({w['stage']})" for n, w in watch.items())
                raise StageFailedError(f"{where}, input {names}: upstream stage {stage!r} of the hybrid producer "
                                       f"{failure}")
        last_change = max([float(marker["since"]), *(_last_change(self._layout(config, dag_id, run_id, stage))
                                                     for stage in upstream_stages)])
        if time.time() - last_change > config.hybrid_input_timeout:
            missing = ", ".join(f"{n!r} ({w['stage']})" for n, w in watch.items())
            raise StageFailedError(f"{where}, input {missing}: no usable plan of the hybrid producer stage, and "
                                   f"nothing upstream of it changed for {config.hybrid_input_timeout:g}s "
                                   "(hybrid_input_timeout); did it start?")
        self.log.info("stage %s: waiting for the plans of hybrid producers %s", self.stage,
                      ", ".join(w["stage"] for w in watch.values()))
        self.defer(trigger=HybridInputsTrigger(where=where, inputs=watch, clear_number=clear_number,
                                               deferred_at=time.time(), window=HYBRID_WAIT_WINDOW),
                   method_name="resume_after_inputs")
        return None

    def _ancestors(self, stages: set[str]) -> set[str]:
        """``stages`` and every stage upstream of them, transitively."""
        seen: set[str] = set()
        pending = list(stages)
        while pending:
            stage = pending.pop()
            if stage not in seen:
                seen.add(stage)
                pending += self.graph.upstreams(stage)
        return seen

    def _plan_and_defer(self, context: Any, config: SpeculativeConfig) -> Any:
        """Plan (once every hybrid producer has a plan), write plan.json, defer to the stage controller."""
        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        layout = self._layout(config, dag_id, run_id)
        spec = self.graph.stages[self.stage]
        where = f"pipeline {self.graph.name!r}, stage {self.stage!r}"
        application = application_path(spec.application, where)
        source_files = list_sources(spec, where)
        sink = self._rendered_sink() if self.sink else None
        if sink is not None:
            # Before any compute: a sink that would overwrite the store, a source or another stage's output.
            sink.validate_plan(PlanContext(
                dag_id=dag_id, run_id=run_id, stage=self.stage, where=f"{where}, sink {type(sink).__name__}",
                store_root=layout.root,
                source_paths=tuple(source_root(src) for src in spec.inputs.values() if isinstance(src, SourceSpec)),
                declared=self.sink.describe() if self.sink is not None else None))
        hybrid = self._hybrid_inputs(config, context)
        if hybrid is None:
            return None  # deferred until the hybrid producers have plans
        # A hybrid producer is planned on its plan (always, so a retry plans the same ranges), others on commits.
        upstream = {name: hybrid[name] if name in hybrid else read_committed(self._layout(config, dag_id, run_id, name))
                    for name in self.graph.upstreams(self.stage)}
        logical_date = context.get("logical_date")
        plan = plan_stage(
            self.graph, self.stage, config, source_files=source_files, upstream_committed=upstream,
            sink=sink.to_json() if sink is not None else None,
            speculation_blocker=self._speculation_blocker(),
            context={"dag_id": dag_id, "run_id": run_id, "store_root": str(layout.root),
                     "logical_date": logical_date.isoformat() if logical_date else None,
                     "application": application, "try_number": context["ti"].try_number,
                     "clear_number": _clear_number(context),
                     "targets": resolve_targets(config, application=application, spark_conf=spec.spark_conf,
                                                app_name=f"{dag_id}.{self.stage}", where=where)})
        previous = read_json(layout.plan)
        conf = (context.get("dag_run").conf or {}) if context.get("dag_run") is not None else {}
        force = self.force_rerun or bool(conf.get("speculative_force_rerun"))
        if force or (previous and previous.get("fingerprint") != plan["fingerprint"]):
            if previous:
                StageController(previous).kill_all("full rerun forced" if force else "stage replanned")
            wipe_stage_attempts(layout)
        elif previous:
            # A retried or cleared task reruns only subtasks without a valid committed result.
            observer = attempt_observer(layout)
            for subtask, attempt, reason in broken_admissions(layout, plan["parallelism"]):
                observer.invalidate(subtask, attempt, f"committed output no longer valid: {reason}")
                journal(layout, "invalidate", subtask=subtask, attempt=attempt, reason=reason)
        atomic_write_json(layout.plan, plan)
        journal(layout, "plan_decided", parallelism=plan["parallelism"], decision=plan["parallelism_decision"])
        for warning in plan["warnings"]:
            self.log.warning("stage %s: %s", self.stage, warning)
            journal(layout, "plan_warning", message=warning)
        self.log.info("stage %s: %d subtasks, speculation %s, plan %s", self.stage, plan["parallelism"],
                      "blocked: " + plan["speculation_blocker"] if plan["speculation_blocker"] else
                      ("enabled" if config.enabled else "disabled"), layout.plan)
        record_task_state(layout, "deferred", try_number=context["ti"].try_number,
                          clear_number=_clear_number(context))
        # A stage without a sink or outlets needs nothing of the worker to commit: the trigger commits it and
        # ends the task from the triggerer (control/commit.py); the others resume here in execute_complete.
        commit = ({"try_number": context["ti"].try_number, "clear_number": _clear_number(context)}
                  if self.commit_in_triggerer and self.sink is None and not self.outlets else None)
        self.defer(trigger=StageControllerTrigger(plan_path=str(layout.plan), deferred_at=time.time(), commit=commit),
                   method_name="execute_complete")

    def _claim_store(self, root: Path, where: str) -> None:
        """Own the store root (refuse a foreign directory) and record which metadata database it belongs to."""
        identity = metadata_db_identity()
        try:
            # Without a database here (an Airflow 3 task) only the ownership marker is written.
            record = claim_store(root, identity) if identity is not None else own_store(root)
        except StoreNotOwnedError as exc:
            # Writing here would make gc treat whatever else lives there as deleted DAG runs.
            raise PlanError(f"{where}: {exc}") from None
        except StoreError as exc:
            self.log.warning("could not record the store's metadata database: %s", exc)
            return
        if identity is None:
            return
        recorded = (record or {}).get("metadata_db") or {}
        if recorded.get("id") != identity["id"]:
            self.log.warning("store %s belongs to metadata database %s, not this Airflow's %s: "
                             "`airflow speculative gc` here will not delete runs", root, recorded.get("url"),
                             identity["url"])

    def _rendered_sink(self) -> Sink:
        assert self.sink is not None
        return type(self.sink)(**(self.sink_args or {}))

    # -- finalize (worker) ------------------------------------------------------------------

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Finalize-on-master: commit exactly the admitted attempt of every subtask, then clean losers."""
        plan = _event_plan(event, self.graph.name, self.stage)
        layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
        summary = event.get("summary", {})
        if event["status"] != "success":
            self._cleanup_sink_staging(plan, layout, None)
            message = _failure_message(self.graph.name, self.stage, event)
            record_task_state(layout, "failed", try_number=context["ti"].try_number,
                              clear_number=_clear_number(context), reason=message.splitlines()[0])
            raise StageFailedError(message)

        def finalize_sink(admitted: dict[int, int], record: dict[str, Any]) -> dict[str, Any] | None:
            sink = Sink.from_json(plan["output"]["sink"])
            ctx = FinalizationContext(
                parallelism=plan["parallelism"], dag_id=plan["dag_id"], run_id=plan["run_id"], stage=plan["stage"],
                logical_date=plan.get("logical_date"),
                attempts={s: AttemptResult(subtask=s, attempt=a, data_dir=layout.data(s, a),
                                           files=record["subtasks"][str(s)]["files"],
                                           records=record["subtasks"][str(s)]["records"],
                                           sink_info=record["subtasks"][str(s)]["sink"])
                          for s, a in admitted.items()})
            return sink.finalize_global(ctx)

        record, sink_result = commit_admitted(
            plan, layout, event, try_number=context["ti"].try_number, clear_number=_clear_number(context),
            finalize_sink=finalize_sink if plan["output"].get("sink") else None)
        self._publish_asset_event(context, plan, record, summary, sink_result)
        removed, losers = remove_losers(layout, plan["parallelism"], admitted_of(event))
        if losers:
            self._cleanup_sink_staging(plan, layout, losers)
        StageMetrics.for_plan(plan).emit(summary, only_changed=False)
        self.log.info("stage %s committed %d subtasks (removed %d losing outputs); speculation %s; "
                      "numSlowExecutionVertices=%s numEffectiveSpeculativeExecutions=%s",
                      self.stage, len(event["admitted"]), removed, summary.get("speculation"),
                      summary.get("numSlowExecutionVertices"), summary.get("numEffectiveSpeculativeExecutions"))
        return commit_summary(self.stage, layout, sink_result, summary)

    def _publish_asset_event(self, context: Any, plan: dict[str, Any], record: dict[str, Any],
                             summary: dict[str, Any], sink_result: dict[str, Any] | None) -> None:
        """Describe the commit in the sink asset's event; Airflow records it when the task succeeds."""
        outlet_events = context.get("outlet_events") if hasattr(context, "get") else None
        if self.sink_asset is None or outlet_events is None:
            return
        accessor = outlet_events[self.sink_asset]
        accessor.extra = asset_event_extra(plan, record, summary, sink_result)
        if self.asset_partitioned:
            key = context.get("partition_key") or partition_key(plan.get("logical_date"))
            if key:
                accessor.add_partitions(key)

    def _cleanup_sink_staging(self, plan: dict[str, Any], layout: StageLayout,
                              attempts: tuple[tuple[int, int], ...] | None) -> None:
        """Let the sink remove what attempts staged outside the store (all of a failed run, or the losers)."""
        if not (plan.get("output") or {}).get("sink"):
            return
        scope = StagingScope(plan["dag_id"], plan["run_id"], plan["stage"], attempts)
        try:
            removed = Sink.from_json(plan["output"]["sink"]).cleanup_staging(scope)
        except Exception as exc:  # clean-up must not hide the stage's own outcome; gc finds what is left
            self.log.warning("stage %s: sink staging clean-up failed (airflow speculative gc will retry): %s",
                             self.stage, exc)
            journal(layout, "sink_staging_cleanup_failed", error=f"{type(exc).__name__}: {exc}")
            return
        if removed:
            journal(layout, "sink_staging_removed", objects=removed,
                    scope="stage run" if attempts is None else "losers")


def sink_asset(sink: Sink | None) -> Any:
    """The Airflow asset a sink's commits update (None without a sink or a parse-time URI)."""
    uri = sink.asset_uri() if sink is not None else None
    if uri is None:
        return None
    from airflow.sdk import Asset

    return Asset(uri=uri)


def asset_event_extra(plan: dict[str, Any], record: dict[str, Any], summary: dict[str, Any],
                      sink_result: dict[str, Any] | None) -> dict[str, Any]:
    """What a consumer needs to know about one commit without reading the store (JSON values only)."""
    subtasks = record.get("subtasks") or {}
    result = sink_result or {}
    # The attempts' manifests count records; a sink's own count is the fallback (it may not count them).
    counts = [e.get("records") for e in subtasks.values()]
    records = sum(int(c) for c in counts) if counts and None not in counts else result.get("records")
    files = result.get("files")
    if not isinstance(files, int):
        files = sum(len(e.get("files") or ()) or int(e.get("file_count") or 0) for e in subtasks.values())
    return {"dag_id": plan["dag_id"], "run_id": plan["run_id"], "stage": plan["stage"],
            "logical_date": plan.get("logical_date"), "records": records, "files": files,
            "location": result.get("path") or result.get("table"),
            "attempts_admitted": {k: e.get("attempt") for k, e in sorted(subtasks.items(), key=lambda i: int(i[0]))},
            "numEffectiveSpeculativeExecutions": summary.get("numEffectiveSpeculativeExecutions"),
            "numSlowExecutionVertices": summary.get("numSlowExecutionVertices")}


def journal(layout: StageLayout, event: str, **fields: Any) -> None:
    """Record a planning or finalize step next to the controller's decisions."""
    journals.record(layout.journal, event, **fields)


def _last_change(layout: StageLayout) -> float:
    """When anything of a stage run last changed in the store (its journal, summary or task state)."""
    times = [0.0]
    for path in (layout.journal, layout.summary, layout.dir / "task.json"):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times)


def _clear_number(context: Any) -> int:
    """How often the DAG run's tasks were cleared (Airflow 3 counts it); 0 when unknown."""
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    return int(getattr(dag_run, "clear_number", 0) or 0)


def _event_plan(event: Any, pipeline: str, stage: str) -> dict[str, Any]:
    """The plan an event points at, or a clear error if the event is not one the controller sends."""
    where = f"pipeline {pipeline!r}, stage {stage!r}"
    if not isinstance(event, dict) or event.get("status") not in ("success", "failed") or "plan_path" not in event:
        raise StageFailedError(f"{where}: malformed controller event {event!r} (expected status success|failed "
                               "and plan_path); the trigger and the worker may run different provider versions")
    plan = read_json(event["plan_path"])
    if plan is None:
        raise StageFailedError(f"{where}: the plan {event['plan_path']} of this stage run is gone from the store")
    if event["status"] == "success" and not isinstance(event.get("admitted"), dict):
        raise StageFailedError(f"{where}: malformed controller event: 'admitted' missing ({event!r})")
    return plan


def _failure_message(pipeline: str, stage: str, event: dict[str, Any]) -> str:
    causes = event.get("causes") or ["(none recorded)"]
    total = event.get("failed_attempts") or len(causes)
    counts = event.get("counts_by_cause") or {}
    lines = [f"pipeline {pipeline!r}, stage {stage!r} failed: {event.get('reason')}"]
    if counts:
        lines.append("failed attempts by cause: " + "; ".join(f"{n} x {c}" for c, n in counts.items()))
    lines += [f"  {c}" for c in causes]
    if total > len(causes):
        lines.append(f"  ... and {total - len(causes)} more failed attempts (see journal.jsonl)")
    return "\n".join(lines)
