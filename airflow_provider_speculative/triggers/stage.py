"""StageStartTrigger: a stage task that starts in the triggerer (``start_from_trigger``). Thin: see control/planning.py.

The scheduler defers the task straight into this trigger when its upstreams succeed: no executor slot,
no worker process and no DAG parse per stage. The trigger plans the stage (in a thread), runs the
stage controller, commits (the sink too) and ends the task from the triggerer. Only a stage with asset
outlets resumes on a worker, after the commit, to publish the asset event; a planning or commit failure
resumes on a worker to fail the task with its message. Such a task has no worker run before its
deferral, so no stale executor event can fail it and no guard delay is needed (docs/design/stage-boundaries.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_provider_speculative.control.planning import HybridWait, RunInfo, StagePlanner, iso_or_none
from airflow_provider_speculative.control.speedcheck import prepare_if_needed
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.core.graph import PipelineGraph, RenderedStage
from airflow_provider_speculative.core.readiness import partition_key
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.core.trigger_events import TaskEvent, TriggerStatus
from airflow_provider_speculative.exceptions import PlanError, UpstreamFailedError, UpstreamSkippedError
from airflow_provider_speculative.hooks.asset_events import resolve_asset_api
from airflow_provider_speculative.hooks.openlineage import prepare_openlineage
from airflow_provider_speculative.hooks.targets import target_connect_urls
from airflow_provider_speculative.sinks.base import Sink
from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.triggers.controller import StageControllerTrigger

# How often a stage waiting for its producers' commits or its hybrid producers' plans looks at the store.
STORE_POLL_SECONDS = 0.1
# How often it asks Airflow for the producers' task states (one supervisor round trip each; they end a wait
# for a producer that failed or accept a commit of an earlier clear when Airflow says the producer succeeded).
STATE_POLL_SECONDS = 2.0


class StageStartTrigger(StageControllerTrigger):
    """Plan, run, speculate and commit one stage run entirely in the triggerer."""

    def __init__(self, graph: dict[str, Any], stage: str, sink_class: str | None = None,
                 sink_args: dict[str, Any] | None = None, declared_sink: dict[str, Any] | None = None,
                 force_rerun: bool = False, publish: bool = False, plan_path: str = "",
                 deferred_at: float = 0.0, commit: dict[str, Any] | None = None, application: str | None = None,
                 application_args: list[str] | None = None, spark_conf: dict[str, str] | None = None,
                 source_paths: dict[str, str] | None = None, outlet_assets: list[dict[str, Any]] | None = None,
                 asset_partitioned: bool = False) -> None:
        super().__init__(plan_path=plan_path, deferred_at=deferred_at, commit=commit)
        self.graph = graph
        self.stage = stage
        self.sink_class = sink_class
        # A template field of the operator: Airflow renders it here (trigger attribute and trigger_kwargs key).
        self.sink_args = sink_args
        self.declared_sink = declared_sink
        self.force_rerun = force_rerun
        self.publish = publish
        # The outlets as plain assets (operators/stage.py api_outlets); None: only a worker can record them.
        self.outlet_assets = outlet_assets
        self.asset_partitioned = asset_partitioned
        # Template fields of the operator too: the triggerer renders them before run() (None: an older trigger).
        self.application = application
        self.application_args = application_args
        self.spark_conf = spark_conf
        self.source_paths = source_paths

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The parse-time arguments: a restarted triggerer plans again from them and the store."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"graph": self.graph, "stage": self.stage, "sink_class": self.sink_class, "sink_args": self.sink_args,
                 "declared_sink": self.declared_sink, "force_rerun": self.force_rerun, "publish": self.publish,
                 "application": self.application, "application_args": self.application_args,
                 "spark_conf": self.spark_conf, "source_paths": self.source_paths,
                 "outlet_assets": self.outlet_assets, "asset_partitioned": self.asset_partitioned})

    def needs_guard(self) -> bool:
        """No worker ran before this deferral, so no stale executor event exists."""
        return False

    def _run_info(self) -> RunInfo:
        """The task try and DAG run this trigger belongs to (the triggerer attaches them for start_from_trigger)."""
        ti: Any = self.task_instance
        if ti is None:
            raise RuntimeError(f"stage {self.stage!r}: started without its task instance (not from start_from_trigger)")
        context = getattr(ti, "_ti_context_from_server", None)
        dag_run = getattr(context, "dag_run", None)
        logical_date = getattr(dag_run, "logical_date", None)
        return RunInfo(dag_id=ti.dag_id, run_id=ti.run_id, try_number=int(ti.try_number),
                       # Airflow 3.3 leaves clear_number out of a trigger's DAG run data (DagRun.dag_run_data):
                       # 0 here; commits made here are fenced by commit_snapshot instead.
                       clear_number=int(getattr(dag_run, "clear_number", 0) or 0),
                       logical_date=logical_date.isoformat() if logical_date is not None else None,
                       conf=dict(getattr(dag_run, "conf", None) or {}), task_id=str(ti.task_id),
                       run_after=iso_or_none(getattr(dag_run, "run_after", None)))

    def _planner(self) -> StagePlanner:
        sink = None
        if self.sink_class is not None:
            sink = Sink.from_json({"class": self.sink_class, "kwargs": self.sink_args or {}})
        rendered = (RenderedStage.rendered(self.application, self.application_args, self.spark_conf, self.source_paths)
                    if self.application is not None else None)
        return StagePlanner(PipelineGraph.from_json(self.graph), self.stage, sink=sink,
                            declared_sink=self.declared_sink, run=self._run_info(), force_rerun=self.force_rerun,
                            logger=self.log, rendered=rendered)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the producers' commits, plan, then control and commit the stage; yield one event."""
        planner: StagePlanner | None = None
        prepare_openlineage()  # its import overlaps planning instead of delaying the first wave
        try:
            planner = await asyncio.to_thread(self._planner)
            await self._prepare_speed_check(planner)
            await asyncio.to_thread(planner.start)
            # Before waiting for producers: a connection that cannot work fails the stage now, not minutes later.
            if self.publish and self.outlet_assets is not None:
                self.asset_api = await resolve_asset_api(planner.config.asset_events_conn_id, planner.where)
            await self._wait_for_commits(planner)
            hybrid = await asyncio.to_thread(planner.hybrid_inputs)
            if isinstance(hybrid, HybridWait):
                # Stages with hybrid inputs start on a worker (their fencing needs the run's clear number).
                raise PlanError(f"{planner.where}: a stage with hybrid inputs cannot start in the triggerer")
            await asyncio.to_thread(planner.plan, hybrid)
        except UpstreamSkippedError as exc:
            await asyncio.to_thread(planner.record_state, TaskState.SKIPPED, str(exc))  # type: ignore[union-attr]
            yield TriggerEvent(TaskEvent(status=TriggerStatus.UPSTREAM_SKIPPED, reason=str(exc)))
            return
        except UpstreamFailedError as exc:
            await asyncio.to_thread(planner.record_failure, exc)  # type: ignore[union-attr]
            self.log.error("%s", exc)
            yield TriggerEvent(TaskEvent(status=TriggerStatus.UPSTREAM_FAILED, reason=str(exc)))
            return
        except Exception as exc:
            # Fail on a worker with the planner's message (it names pipeline, stage and input): the task log
            # shows it as the task's error, and retries behave as for any failed try.
            if planner is not None:
                await asyncio.to_thread(planner.record_failure, exc)
            self.log.error("stage %s: planning failed: %s: %s", self.stage, type(exc).__name__, exc)
            yield TriggerEvent(TaskEvent(status=TriggerStatus.PLAN_FAILED, error=type(exc).__name__, reason=str(exc)))
            return
        run = planner.run
        self.plan_path = str(planner.layout.plan)
        self.commit = {"try_number": run.try_number, "clear_number": run.clear_number, "sink": True,
                       "publish": self.publish, "assets": self.outlet_assets if self.asset_api else None,
                       "partition_key": self._partition_key(run) if self.asset_api else None}
        async for event in super().run():
            yield event

    async def _prepare_speed_check(self, planner: StagePlanner) -> None:
        """Warm the speed check's server sessions while this stage plans, if the run will check (speedcheck.py)."""
        run = planner.run
        try:
            urls = await target_connect_urls(planner.config.targets)
            await asyncio.to_thread(prepare_if_needed, planner.store, urls, f"{run.dag_id}/{run.run_id}",
                                    planner.config.speed_check_age)
        except Exception as exc:  # only a head start: the check itself still runs and reports
            self.log.warning("stage %s: could not prepare the speed check: %s", self.stage, type(exc).__name__)

    def _partition_key(self, run: RunInfo) -> str | None:
        """The asset partition a partitioned sink's event names: the DAG run's, else its logical date's."""
        if not self.asset_partitioned:
            return None
        context = getattr(self.task_instance, "_ti_context_from_server", None)
        key = getattr(getattr(context, "dag_run", None), "partition_key", None)
        return str(key) if key else partition_key(run.logical_date)

    async def _wait_for_commits(self, planner: StagePlanner) -> None:
        """Wait here, with no worker, until every blocking producer committed for this clear of the DAG run.

        The task is scheduled with ``trigger_rule="always"`` as soon as the run starts, so its first launch
        follows its producers' commits by a store poll instead of the scheduler's and triggerer's loops.
        """
        states: dict[str, str | None] = {}
        asked_at = float("-inf")
        started = time.monotonic()
        # Airflow does not hand a trigger the run's clear number: a commit already in the store now may be one
        # that a clear (of the producer with this stage) is about to replace, so it counts only once Airflow
        # says the producer succeeded. A commit made after this point is the producer's current one.
        seen = await asyncio.to_thread(planner.commit_snapshot)
        waiting = await asyncio.to_thread(planner.uncommitted_producers, states, seen)
        if waiting:
            self.log.info("stage %s: waiting for the commits of %s", self.stage, ", ".join(waiting))
            # Visible in `airflow speculative status` and the stage's task.json while the grid says "deferred".
            await asyncio.to_thread(planner.record_state, TaskState.WAITING, f"for the commits of {', '.join(waiting)}")
        asking: asyncio.Task[dict[str, str | None]] | None = None
        try:
            while waiting:
                # The state question is a round trip through the triggerer's supervisor that can take a second
                # when it is busy: ask in the background, so the store is still looked at every 0.1 s.
                if asking is not None and asking.done():
                    states, asking = asking.result(), None
                    asked_at = time.monotonic()
                elif asking is None and time.monotonic() - asked_at >= STATE_POLL_SECONDS:
                    asking = asyncio.create_task(asyncio.to_thread(self._producer_states, planner, waiting))
                await asyncio.sleep(STORE_POLL_SECONDS)
                waiting = await asyncio.to_thread(planner.uncommitted_producers, states, seen)
        finally:
            if asking is not None:
                asking.cancel()
        if planner.blocking_producers():
            await asyncio.to_thread(journals.record_stage, planner.layout, Event.INPUTS_COMMITTED,
                                    waited=round(time.monotonic() - started, 3))

    def _producer_states(self, planner: StagePlanner, producers: list[str]) -> dict[str, str | None]:
        """Airflow's states of the producer tasks in this DAG run ({} when Airflow cannot be asked)."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        ti: Any = self.task_instance
        prefix = ti.task_id[: len(ti.task_id) - len(self.stage)] if ti.task_id.endswith(self.stage) else ""
        try:
            found = RuntimeTaskInstance.get_task_states(dag_id=planner.run.dag_id,
                                                        task_ids=[prefix + p for p in producers],
                                                        run_ids=[planner.run.run_id])
        except Exception as exc:  # the store alone still decides (commits of this clear), only slower
            self.log.warning("stage %s: could not read the producers' task states: %s", self.stage, exc)
            return {}
        by_task = (found or {}).get(planner.run.run_id) or {}
        return {p: _state_name(by_task.get(prefix + p)) for p in producers}

    async def on_kill(self) -> None:
        """Stop every Spark driver of this stage (nothing to stop before the stage was planned)."""
        if self.plan_path:
            await super().on_kill()


def _state_name(state: Any) -> str | None:
    """A task state as its plain name (the API may hand an enum)."""
    if state is None:
        return None
    return str(getattr(state, "value", state))
