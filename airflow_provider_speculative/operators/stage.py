"""SparkStageOperator: plans a stage run, defers once to the controller trigger, then finalizes."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowRescheduleException
from airflow.triggers.base import StartTriggerArgs

from airflow_provider_speculative.core.graph import PipelineGraph, RenderedStage
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.core.trigger_events import DECIDED, ControllerEvent, TriggerStatus
from airflow_provider_speculative.exceptions import StageFailedError
from airflow_provider_speculative.links import SparkHistoryLink, StageViewLink
from airflow_provider_speculative.settings import stage_config
from airflow_provider_speculative.sinks.base import Sink

if TYPE_CHECKING:
    from airflow_provider_speculative.control.planning import StagePlanner
    from airflow_provider_speculative.core.events import Event
    from airflow_provider_speculative.core.plan import StagePlan
    from airflow_provider_speculative.store.layout import StageLayout

# Every DAG file that builds a pipeline imports this module, and a dag-processor parses each file in a
# process of its own every ``min_file_process_interval``: what a stage needs only when it runs (planning,
# the controller, commits, the store) is imported inside the methods that use it, which keeps a parse
# from importing the control plane (about 0.3 s of CPU per file and parse).
START_TRIGGER = "airflow_provider_speculative.triggers.stage.StageStartTrigger"

# A hybrid consumer waits for its producers' plans in a trigger for this long at a time, then
# reschedules: under dag.test() (one task at a time) a consumer picked before its producer must give
# way, and a real scheduler only pays one short worker run per window.
HYBRID_WAIT_WINDOW = 20.0


class SparkStageOperator(BaseOperator):
    """One stage of a speculative pipeline: N subtasks, each attempt a Spark submission.

    Built by :class:`~airflow_provider_speculative.pipeline.Pipeline`; not usually instantiated by hand.
    """

    # Rendered per DAG run (on a worker before execute, or by the triggerer for a stage started there) and
    # checked after rendering when the stage is planned (core/graph.py render_stage).
    template_fields = ("sink_args", "application", "application_args", "spark_conf", "source_paths")
    operator_extra_links = (StageViewLink(), SparkHistoryLink())
    ui_color = "#f4a460"

    def __init__(self, *, graph: PipelineGraph, stage: str, sink: Sink | None = None,
                 force_rerun: bool = False, asset_partitioned: bool = False, commit_in_triggerer: bool = True,
                 **kwargs: Any) -> None:
        starts_in_triggerer = (commit_in_triggerer and stage_config(graph, stage).start_in_triggerer
                               and not graph.in_hybrid_exchange(stage))
        if starts_in_triggerer and graph.upstreams(stage) and "trigger_rule" not in kwargs:
            # Started in the triggerer at the run's start, the task waits there for its producers' commits and
            # launches on the next store poll, not after the scheduler's and triggerer's loops; a producer that
            # fails fails it, naming the producer (docs/running.md, "Where a stage runs").
            kwargs["trigger_rule"] = "always"
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
        declared = RenderedStage.of(graph.stages[stage])
        self.application = declared.application
        self.application_args = list(declared.application_args)
        self.spark_conf = dict(declared.spark_conf)
        self.source_paths = dict(declared.source_paths)
        self.force_rerun = force_rerun
        self.asset_partitioned = asset_partitioned
        self.commit_in_triggerer = commit_in_triggerer
        if starts_in_triggerer:
            self._start_in_triggerer()

    # -- planning (worker) ------------------------------------------------------------------

    def _start_in_triggerer(self) -> None:
        """Let the scheduler defer this task straight into the triggerer, which plans, runs and commits it.

        Only when the whole graph is JSON (it travels in the trigger's arguments); ``dag.test()`` ignores
        ``start_from_trigger`` and runs :meth:`execute` on a worker, as ``commit_in_triggerer=False`` does.
        """
        try:
            graph = json.loads(json.dumps(self.graph.to_json()))
        except (TypeError, ValueError) as exc:
            self.log.warning("stage %s starts on a worker: its pipeline's config is not JSON (%s)", self.stage, exc)
            return
        sink = self.sink.to_json() if self.sink is not None else None
        self.start_from_trigger = True
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls=START_TRIGGER,
            next_method="resume_from_trigger",
            trigger_kwargs={"graph": graph, "stage": self.stage, "sink_class": sink["class"] if sink else None,
                            "sink_args": self.sink_args, "declared_sink": json.loads(json.dumps(self.sink_args)),
                            "force_rerun": self.force_rerun, "publish": bool(self.outlets),
                            "outlet_assets": api_outlets(self.outlets, self.sink_asset),
                            "asset_partitioned": self.asset_partitioned,
                            **RenderedStage.of(self.graph.stages[self.stage]).to_json()},
            next_kwargs=None, timeout=None)

    def _planner(self, context: Any) -> StagePlanner:
        from airflow_provider_speculative.control.planning import RunInfo, StagePlanner, iso_or_none

        dag_run = context.get("dag_run")
        logical_date = context.get("logical_date")
        run = RunInfo(dag_id=context["dag"].dag_id, run_id=context["run_id"], try_number=context["ti"].try_number,
                      clear_number=_clear_number(context),
                      logical_date=logical_date.isoformat() if logical_date else None,
                      conf=dict((dag_run.conf or {}) if dag_run is not None else {}),
                      task_id=self.task_id, run_after=iso_or_none(getattr(dag_run, "run_after", None)))
        return StagePlanner(self.graph, self.stage, sink=self._rendered_sink() if self.sink else None,
                            declared_sink=self.sink.describe() if self.sink is not None else None, run=run,
                            force_rerun=self.force_rerun, logger=self.log, rendered=self._rendered_stage())

    def _rendered_stage(self) -> RenderedStage:
        """The templated stage fields as Airflow rendered them before this worker run."""
        return RenderedStage.rendered(self.application, self.application_args, self.spark_conf, self.source_paths)

    def execute(self, context: Any) -> Any:
        """Resolve the plan, write plan.json, and defer to the stage controller (recording the task's state)."""
        from airflow_provider_speculative.hooks.openlineage import prepare_openlineage

        prepare_openlineage()  # its import overlaps planning instead of delaying the first wave
        planner = self._planner(context)
        _arm_fast_exit(planner, self.log)
        _prepare_speed_check(planner, self.log)
        planner.start()
        try:
            return self._plan_and_defer(planner)
        except AirflowRescheduleException:
            # Giving way to producers (dag.test()) is not a failure: consumers of this stage must keep waiting.
            planner.record_state(TaskState.WAITING, "rescheduled until its producers committed")
            raise
        except Exception as exc:
            # Hybrid consumers of this stage read this to fail at once instead of waiting (core/hybrid.py).
            planner.record_failure(exc)
            raise

    def resume_after_inputs(self, context: Any, event: dict[str, Any]) -> Any:
        """The hybrid producers' plans are there (plan now), or not yet (reschedule), or one failed."""
        status = (event or {}).get("status")
        if status == TriggerStatus.FAILED:
            self._planner(context).record_state(TaskState.FAILED, reason=event.get("reason"))
            raise StageFailedError(event.get("reason") or f"pipeline {self.graph.name!r}, stage {self.stage!r}: "
                                                          "a hybrid producer failed")
        if status == TriggerStatus.WAITING:
            from airflow.sdk.timezone import utcnow

            raise AirflowRescheduleException(utcnow())
        return self.execute(context)

    def _plan_and_defer(self, planner: StagePlanner) -> Any:
        """Plan (once every hybrid producer has a plan), write plan.json, defer to the stage controller."""
        from airflow_provider_speculative.control.planning import HybridWait
        from airflow_provider_speculative.triggers import timing
        from airflow_provider_speculative.triggers.controller import StageControllerTrigger
        from airflow_provider_speculative.triggers.hybrid import HybridInputsTrigger

        # Checks that need no upstream output come first, before waiting for hybrid producers.
        planner.application()
        planner.validate_sink()
        hybrid = planner.hybrid_inputs()
        if getattr(self.trigger_rule, "value", self.trigger_rule) == "always" and not isinstance(hybrid, HybridWait):
            # Scheduled before its producers finished (dag.test() runs tasks in any order): wait for commits.
            uncommitted = planner.uncommitted_producers()
            if uncommitted:
                hybrid = HybridWait(planner.where, {
                    f"{p} (commit)": planner.watch_entry(p, need="commit")
                    for p in uncommitted})
        if isinstance(hybrid, HybridWait):
            self.log.info("stage %s: waiting for the plans (or commits) of producers %s", self.stage,
                          ", ".join(w["stage"] for w in hybrid.inputs.values()))
            trigger = HybridInputsTrigger(where=hybrid.where, inputs=hybrid.inputs,
                                          clear_number=planner.run.clear_number, deferred_at=time.time(),
                                          window=HYBRID_WAIT_WINDOW)
            if timing.runs_in_line():
                # dag.test() runs one task at a time and would run this trigger in line: nothing can change
                # while it waits, so give way to the producers at once (or fail if one failed).
                event = trigger.check()
                if event is not None and event["status"] == TriggerStatus.FAILED:
                    raise StageFailedError(event["reason"])
                from airflow.sdk.timezone import utcnow

                raise AirflowRescheduleException(utcnow())
            self.defer(trigger=trigger, method_name="resume_after_inputs")
            return None
        planner.plan(hybrid)
        run = planner.run
        # A stage without a sink or outlets needs nothing of the worker to commit: the trigger commits it and
        # ends the task from the triggerer (control/commit.py); the others resume here in execute_complete.
        commit = ({"try_number": run.try_number, "clear_number": run.clear_number}
                  if self.commit_in_triggerer and self.sink is None and not self.outlets else None)
        self.defer(trigger=StageControllerTrigger(plan_path=str(planner.layout.plan), deferred_at=time.time(),
                                                  commit=commit),
                   method_name="execute_complete")

    def _rendered_sink(self) -> Sink:
        assert self.sink is not None
        return type(self.sink)(**(self.sink_args or {}))

    def resume_from_trigger(self, context: Any, event: dict[str, Any]) -> Any:
        """A stage started in the triggerer resumes here only to publish its asset event or to fail."""
        status = (event or {}).get("status")
        where = f"pipeline {self.graph.name!r}, stage {self.stage!r}"
        if status == TriggerStatus.PLAN_FAILED:
            reason = str(event.get("reason") or "")
            # The planner's messages name pipeline and stage; anything else gets them in front.
            raise StageFailedError(reason if reason.startswith(where) else f"{where}: {event.get('error')}: {reason}")
        if status == TriggerStatus.COMMIT_FAILED:
            raise StageFailedError(f"{where}: {event.get('reason')}")
        if status == TriggerStatus.TIMED_OUT:
            _raise_timed_out(event, where)
        if status == TriggerStatus.UPSTREAM_FAILED:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(event.get("reason") or f"{where}: a producer stage failed")
        if status == TriggerStatus.UPSTREAM_SKIPPED:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(event.get("reason") or f"{where}: a producer stage was skipped")
        if status == TriggerStatus.COMMITTED:
            from airflow_provider_speculative.store.layout import StageLayout
            from airflow_provider_speculative.store.results import read_committed

            plan = _plan_at(event.get("plan_path"), where)
            layout = StageLayout.of_plan(plan)
            record = read_committed(layout)  # raises naming the stage if the commit is gone
            result = event.get("result") or {}
            self._push_app_ids(context, plan, layout)
            self._publish_asset_event(context, plan, record, record.get("summary") or {}, result.get("sink"))
            return result
        return self.execute_complete(context, event)

    # -- finalize (worker) ------------------------------------------------------------------

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Finalize-on-master: commit exactly the admitted attempt of every subtask, then clean losers."""
        from airflow_provider_speculative.control.attemptlog import failure_log_lines
        from airflow_provider_speculative.control.commit import (
            admitted_of,
            commit_admitted,
            commit_summary,
            remove_losers,
            sink_finalizer,
        )
        from airflow_provider_speculative.metrics import StageMetrics
        from airflow_provider_speculative.store.layout import StageLayout
        from airflow_provider_speculative.store.task_state import record_task_state

        if (event or {}).get("status") == TriggerStatus.TIMED_OUT:
            _raise_timed_out(event, f"pipeline {self.graph.name!r}, stage {self.stage!r}")
        plan, decided = _event_plan(event, self.graph.name, self.stage)
        layout = StageLayout.of_plan(plan)
        summary = decided.get("summary", {})
        if decided["status"] != TriggerStatus.SUCCESS:
            self._cleanup_sink_staging(plan, layout, None)
            message = "\n".join([_failure_message(self.graph.name, self.stage, decided),
                                 *failure_log_lines(layout, _failed_keys(decided))])
            record_task_state(layout, TaskState.FAILED, try_number=context["ti"].try_number,
                              clear_number=_clear_number(context), reason=message.splitlines()[0])
            # For a failed stage too: its attempts' Spark applications are where its failure is explained.
            # Pushed after the clean-up and the task state, and never in place of the stage's own failure.
            try:
                self._push_app_ids(context, plan, layout)
            except Exception as exc:
                self.log.warning("stage %s: could not push its Spark application ids: %s", self.stage, exc)
            raise StageFailedError(message)

        record, sink_result = commit_admitted(
            plan, layout, decided, try_number=context["ti"].try_number, clear_number=_clear_number(context),
            finalize_sink=sink_finalizer(plan, layout))
        self._push_app_ids(context, plan, layout)
        self._publish_asset_event(context, plan, record, summary, sink_result)
        removed, losers = remove_losers(layout, plan["parallelism"], admitted_of(decided))
        if losers:
            self._cleanup_sink_staging(plan, layout, losers)
        StageMetrics.for_plan(plan).emit(summary, only_changed=False)
        self.log.info("stage %s committed %d subtasks (removed %d losing outputs); speculation %s; "
                      "numSlowExecutionVertices=%s numEffectiveSpeculativeExecutions=%s",
                      self.stage, len(decided["admitted"]), removed, summary.get("speculation"),
                      summary.get("numSlowExecutionVertices"), summary.get("numEffectiveSpeculativeExecutions"))
        return commit_summary(self.stage, layout, sink_result, summary)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (with its provider installed): the datasets this stage read and the one it wrote.

        A committed output carries its schema and output statistics, as in a try that ends in the triggerer.
        """
        from airflow_provider_speculative.control.lineage_events import operator_lineage
        from airflow_provider_speculative.settings import configured_store

        return operator_lineage(configured_store(stage_config(self.graph, self.stage)), task_instance.dag_id,
                                task_instance.run_id, self.graph.store_key(self.stage), self.sink)

    def _publish_asset_event(self, context: Any, plan: StagePlan, record: dict[str, Any],
                             summary: Mapping[str, Any], sink_result: dict[str, Any] | None) -> None:
        """Describe the commit in the sink asset's event; Airflow records it when the task succeeds."""
        from airflow_provider_speculative.core.asset_events import asset_event_extra
        from airflow_provider_speculative.core.readiness import partition_key

        outlet_events = context.get("outlet_events") if hasattr(context, "get") else None
        if self.sink_asset is None or outlet_events is None:
            return
        accessor = outlet_events[self.sink_asset]
        accessor.extra = asset_event_extra(plan, record, summary, sink_result)
        if self.asset_partitioned:
            key = context.get("partition_key") or partition_key(plan.get("logical_date"))
            if key:
                accessor.add_partitions(key)

    def _cleanup_sink_staging(self, plan: StagePlan, layout: StageLayout,
                              attempts: tuple[tuple[int, int], ...] | None) -> None:
        from airflow_provider_speculative.control.commit import cleanup_sink_staging

        cleanup_sink_staging(plan, layout, attempts, self.log)

    def _push_app_ids(self, context: Any, plan: StagePlan, layout: StageLayout) -> None:
        """Push the attempts' Spark application ids under their stable XCom keys (control/appids.py)."""
        from airflow_provider_speculative.control.appids import app_id_xcoms

        for key, value in app_id_xcoms(layout, plan["parallelism"], self.log.warning).items():
            context["ti"].xcom_push(key=key, value=value)


def api_outlets(outlets: Any, sink_asset: Any) -> list[dict[str, Any]] | None:
    """The outlets as ``[{"uri", "sink"}]`` for recording through the REST API; None if one is not a plain Asset.

    An alias or a reference names its asset only at run time, on a worker: such a task resumes there.
    """
    from airflow.sdk import Asset

    out = []
    for outlet in outlets or ():
        if type(outlet) is not Asset:
            return None
        out.append({"uri": outlet.uri, "sink": outlet == sink_asset})
    return out


def sink_asset(sink: Sink | None) -> Any:
    """The Airflow asset a sink's commits update (None without a sink or a parse-time URI)."""
    uri = sink.asset_uri() if sink is not None else None
    if uri is None:
        return None
    from airflow.sdk import Asset

    return Asset(uri=uri)


def journal(layout: StageLayout, event: Event, **fields: Any) -> None:
    """Record a planning or finalize step next to the controller's decisions."""
    from airflow_provider_speculative.store import journal as journals

    journals.record_stage(layout, event, **fields)


def _clear_number(context: Any) -> int:
    """How often the DAG run's tasks were cleared (Airflow 3 counts it); 0 when unknown."""
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    return int(getattr(dag_run, "clear_number", 0) or 0)


def _event_plan(event: Any, pipeline: str, stage: str) -> tuple[StagePlan, ControllerEvent]:
    """The plan an event points at and the event, or a clear error if it is not one the controller sends."""
    where = f"pipeline {pipeline!r}, stage {stage!r}"
    if not isinstance(event, dict) or event.get("status") not in DECIDED or "plan_path" not in event:
        raise StageFailedError(f"{where}: malformed controller event {event!r} (expected status success|failed "
                               "and plan_path); the trigger and the worker may run different provider versions")
    plan = _plan_at(event["plan_path"], where)
    if event["status"] == TriggerStatus.SUCCESS and not isinstance(event.get("admitted"), dict):
        raise StageFailedError(f"{where}: malformed controller event: 'admitted' missing ({event!r})")
    return plan, cast(ControllerEvent, event)


def _plan_at(plan_path: Any, where: str) -> StagePlan:
    """The stage run's plan.json an event points at, or a clear error if it is gone or of another version."""
    from airflow_provider_speculative.core.plan import load_plan
    from airflow_provider_speculative.settings import read_plan_at

    # A path on POSIX, the plan's URL on a store without paths (read by name there).
    plan = read_plan_at(plan_path) if isinstance(plan_path, str) and plan_path else None
    if plan is None:
        raise StageFailedError(f"{where}: the plan {plan_path!r} of this stage run is gone from the store")
    return load_plan(plan, f"{where}: plan {plan_path}")


def _failed_keys(event: ControllerEvent) -> list[tuple[int, int]]:
    """(subtask, attempt) of the failed attempts an event names; an older controller's event names none."""
    keys = event.get("failed_keys")
    if not isinstance(keys, list):
        return []
    return [(int(k[0]), int(k[1])) for k in keys if isinstance(k, list) and len(k) == 2
            and all(isinstance(v, int) for v in k)]


def _failure_message(pipeline: str, stage: str, event: ControllerEvent) -> str:
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


def _raise_timed_out(event: dict[str, Any], where: str) -> None:
    """Fail the task as Airflow fails a task past its ``execution_timeout``, with the trigger's reason."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    raise AirflowTaskTimeout(str(event.get("reason") or f"{where}: the task's execution_timeout passed"))


def _arm_fast_exit(planner: StagePlanner, log: Any) -> None:
    """In the ``airflow dags test`` process, skip the interpreter's shutdown collection at exit (processexit.py)."""
    from airflow_provider_speculative.processexit import arm_for_dags_test

    if arm_for_dags_test(planner.config.fast_exit):
        log.info("this airflow dags test process collects garbage once at its exit and skips the interpreter's "
                 "shutdown collection ([speculative] fast_exit)")


def _prepare_speed_check(planner: StagePlanner, log: Any) -> None:
    """Warm the speed check's server sessions while the stage plans, if the run will check (speedcheck.py)."""
    from airflow_provider_speculative.control.speedcheck import prepare_if_needed
    from airflow_provider_speculative.hooks.targets import target_connect_urls_sync

    run = planner.run
    try:
        prepare_if_needed(planner.store, target_connect_urls_sync(planner.config.targets), f"{run.dag_id}/{run.run_id}",
                          planner.config.speed_check_age)
    except Exception as exc:  # only a head start: the check itself still runs and reports
        log.warning("stage %s: could not prepare the speed check: %s", planner.stage, type(exc).__name__)
