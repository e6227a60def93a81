"""StageControllerTrigger: the deferrable stage controller. Thin: the work is in StageController."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_provider_speculative.control.appids import app_id_xcoms
from airflow_provider_speculative.control.asset_events import publish_asset_events
from airflow_provider_speculative.control.commit import (
    admitted_of,
    cleanup_sink_staging,
    commit_admitted,
    commit_summary,
    hold_after_commit,
    remove_losers,
    sink_finalizer,
)
from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.control.kill import kill_stage
from airflow_provider_speculative.control.lineage_events import TaskEnd, report_task_end
from airflow_provider_speculative.control.logstream import DriverLogStream
from airflow_provider_speculative.core.asset_events import asset_event_extra, commit_key
from airflow_provider_speculative.core.contract import EXTRA_CONF_ENV
from airflow_provider_speculative.core.plan import StagePlan, load_plan
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.core.trigger_events import ControllerEvent, TaskEvent, TriggerStatus
from airflow_provider_speculative.hooks.asset_events import AssetApiConnection, AssetApiError, AssetEventsApi
from airflow_provider_speculative.hooks.objectstore import attempt_s3_env
from airflow_provider_speculative.hooks.openlineage import openlineage_spark_conf
from airflow_provider_speculative.hooks.targets import connect_env
from airflow_provider_speculative.metrics import StageMetrics
from airflow_provider_speculative.settings import read_plan_at
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import read_committed
from airflow_provider_speculative.store.task_state import record_task_state
from airflow_provider_speculative.triggers.timing import await_next_step, min_seconds_before_event, runs_in_line


class StageControllerTrigger(BaseTrigger):
    """Launch, watch, speculate and cancel the attempts of one stage run; fire once when it is decided."""

    def __init__(self, plan_path: str, deferred_at: float, commit: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.plan_path = plan_path
        self.deferred_at = deferred_at
        # Set (try and clear number of the task) when this trigger may commit a successful stage itself and
        # end the task from the triggerer (control/commit.py). A stage deferred from a worker gets it only
        # without a sink and outlets; a stage started in the triggerer (triggers/stage.py) always, with
        # "sink" (finalize the sink here) and "publish" (resume on a worker to publish the asset event).
        self.commit = commit
        # Set by StageStartTrigger at plan when the asset events can be recorded through the api-server.
        self.asset_api: AssetApiConnection | None = None
        # The stage's controller while run() steps it: cleanup() stops its attempts after a timeout.
        self._controller: StageController | None = None
        # The plan and the attempts' secrets once run() has them: a timeout before the controller is open
        # (a speed check, a large restore) stops the attempts from the store with them.
        self._running: tuple[StagePlan, dict[str, str], dict[str, dict[str, str]]] | None = None
        self._stopped = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Only the plan path, deferral time and commit right: everything else is rebuilt from the store."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"plan_path": self.plan_path, "deferred_at": self.deferred_at, "commit": self.commit})

    def _plan(self) -> StagePlan:
        # A path on POSIX, the plan's URL on a store without paths: read by name there.
        plan = read_plan_at(self.plan_path)
        if plan is None:
            raise FileNotFoundError(f"stage plan {self.plan_path} is missing")
        return load_plan(plan, f"stage plan {self.plan_path}")

    @staticmethod
    async def _attempt_env(plan: StagePlan) -> dict[str, str]:
        """What attempts get in their environment, never in the store: S3 and sink connections, OpenLineage."""
        # The S3 credentials of [speculative] s3_conn_id when the store or a source is on S3 (hooks/objectstore.py).
        env: dict[str, str] = await attempt_s3_env(plan)
        lineage = await asyncio.to_thread(openlineage_spark_conf, plan)
        if lineage:
            env[EXTRA_CONF_ENV] = json.dumps(lineage)
        if not plan["output"].get("sink"):
            return env
        from airflow.sdk import BaseHook

        from airflow_provider_speculative.sinks.base import Sink

        sink = Sink.from_json(plan["output"]["sink"])
        # Triggers may only use the async connection lookup.
        connections = {conn_id: await BaseHook.aget_connection(conn_id) for conn_id in sink.runtime_connections()}
        return {**env, **sink.runtime_env(connections)}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Step the controller every check interval (sooner when an attempt changed) until decided; yield one event."""
        plan = await asyncio.to_thread(self._plan)
        env = await self._attempt_env(plan)
        target_env = await connect_env(plan)
        self._running = (plan, env, target_env)
        started = time.time()
        controller = await asyncio.to_thread(StageController.open, plan, extra_env=env, target_env=target_env)
        self._controller = controller
        config = controller.config
        # The attempts' driver logs, tailed into this task's log (control/logstream.py).
        logs = (DriverLogStream(controller.layout, max_lines=config.driver_log_lines,
                                max_bytes=config.driver_log_bytes, since=started, period=config.check_interval)
                if config.driver_log_lines > 0 else None)
        metrics = StageMetrics.for_plan(controller.plan)
        in_line = runs_in_line()
        guard = min_seconds_before_event() if self.needs_guard() else 0.0
        waiting: str | None = None
        while True:
            if self.timed_out():
                reason = await self._stop_attempts()
                yield TriggerEvent(TaskEvent(status=TriggerStatus.TIMED_OUT, plan_path=self.plan_path, reason=reason))
                return
            await asyncio.to_thread(controller.step)
            self._log_lines(await asyncio.to_thread(_driver_log_lines, logs, controller, False))
            summary = controller.summary()
            metrics.emit(summary)
            if bool(summary.get("slot_status")) != bool(waiting):
                # Logged when the stage starts or stops waiting for slots (not every check).
                waiting = summary.get("slot_status")
                self.log.info("stage %s: %s", controller.plan["stage"], waiting or "slots available again")
            if controller.done and (self._ends_here(controller, in_line) or time.time() - self.deferred_at >= guard):
                break
            await await_next_step(controller)
        payload = controller.event_payload()
        self._log_lines(await asyncio.to_thread(_driver_log_lines, logs, controller, True))
        # The task log says where every attempt ran and where its log is (the stage view links each one).
        self.log.info("%s", "\n".join(controller.attempt_lines()))
        if self._ends_here(controller, in_line):
            try:
                result = await asyncio.to_thread(self._commit, controller, payload)
            except Exception as exc:  # a sink that cannot finalize: fail the task on a worker, with the cause
                self.log.exception("stage %s: commit failed", controller.plan["stage"])
                yield TriggerEvent(TaskEvent(status=TriggerStatus.COMMIT_FAILED, plan_path=self.plan_path,
                                             reason=f"commit failed: {type(exc).__name__}: {exc}"))
                return
            publish = bool((self.commit or {}).get("publish"))
            recorded = publish and await self._record_asset_events(controller, result)
            if controller.faults.hold_commit:
                # After the commit and the asset events, before the event that ends the task: the window a
                # killed triggerer leaves to its successor.
                await asyncio.to_thread(hold_after_commit, controller.layout)
            if publish and not recorded:
                yield TriggerEvent(TaskEvent(status=TriggerStatus.COMMITTED, plan_path=self.plan_path, result=result))
                return
            app_ids = await asyncio.to_thread(app_id_xcoms, controller.layout, controller.plan["parallelism"],
                                              self.log.warning)
            # The task ends here, where Airflow's OpenLineage listener never runs: its events come from here.
            await self._report_lineage(controller.plan, started)
            yield TaskSuccessEvent(xcoms={"return_value": result, **app_ids})
            return
        yield TriggerEvent(payload)

    async def _report_lineage(self, plan: StagePlan, started: float) -> None:
        """OpenLineage events of a task try that succeeds in the triggerer (control/lineage_events.py)."""
        context = getattr(self.task_instance, "_ti_context_from_server", None)  # set for start_from_trigger
        dag_run = getattr(context, "dag_run", None)
        # needs_guard(): a worker ran this try before deferring, and Airflow's listener sent its START there.
        end = TaskEnd(ran_on_worker=self.needs_guard(), ended_in_triggerer=True, succeeded=True, started_at=started,
                      dag_run_conf=dict(getattr(dag_run, "conf", None) or {}),
                      nominal_start=_iso(getattr(dag_run, "data_interval_start", None)),
                      nominal_end=_iso(getattr(dag_run, "data_interval_end", None)))
        await report_task_end(plan, end, sink=self._declared_sink(), logger=self.log)

    def _declared_sink(self) -> Any:
        """The sink as declared in the DAG (its lineage dataset is the one its asset names); None without one.

        Only a stage started in the triggerer (StageStartTrigger) commits a sink here, and it carries the
        declared sink's class and arguments.
        """
        sink_class, declared = getattr(self, "sink_class", None), getattr(self, "declared_sink", None)
        if not sink_class or declared is None:
            return None
        from airflow_provider_speculative.sinks.base import Sink

        return Sink.from_json({"class": sink_class, "kwargs": declared})

    def _log_lines(self, lines: list[str]) -> None:
        """One task log record per line, so a log viewer shows each on its own."""
        for line in lines:
            self.log.info("%s", line)

    async def _record_asset_events(self, controller: StageController, result: dict[str, Any]) -> bool:
        """Record the outlets' asset events through the api-server; False: a worker must record them.

        Falls back to the worker when the api-server refuses or does not answer: the task then resumes
        there as without the connection, and nothing is lost.
        """
        assets = (self.commit or {}).get("assets")
        if self.asset_api is None or not assets:
            return False
        plan = controller.plan
        try:
            recorded = await asyncio.to_thread(self._post_asset_events, controller, assets, result)
        except AssetApiError as exc:
            self.log.warning("stage %s: asset event not recorded through %s (%s); the task resumes on a worker to "
                             "record it", plan["stage"], self.asset_api.conn_id, exc)
            return False
        self.log.info("stage %s: asset events recorded through the api-server: %s", plan["stage"], recorded)
        return True

    def _post_asset_events(self, controller: StageController, assets: list[dict[str, Any]],
                           result: dict[str, Any]) -> dict[str, int]:
        plan, layout = controller.plan, controller.layout
        assert self.asset_api is not None and self.commit is not None
        record = read_committed(layout)
        extra = asset_event_extra(plan, record, record.get("summary") or {}, result.get("sink"))
        key = commit_key(plan["dag_id"], plan["run_id"], layout.stage, int(self.commit["try_number"]))
        api = AssetEventsApi(self.asset_api)
        try:
            return publish_asset_events(api, layout, assets, extra, key, self.commit.get("partition_key"))
        finally:
            api.close()

    def needs_guard(self) -> bool:
        """Hold the event back ``min_seconds_before_event``: a worker deferred this task (see triggers/timing.py)."""
        return True

    def _ends_here(self, controller: StageController, in_line: bool) -> bool:
        """Commit here and end the task from the triggerer (no worker run, no scheduler round trip)?

        Only for a decided success of a stage the operator allowed it for, and never in line under
        dag.test(), which resumes the task on its own anyway. The 6 s guard is not needed then: the
        stale executor event of the deferring run ("success") matches the task's final state.
        """
        return self.commit is not None and not in_line and controller.succeeded

    def _commit(self, controller: StageController, payload: ControllerEvent) -> dict[str, Any]:
        plan, layout = controller.plan, controller.layout
        assert self.commit is not None  # only called when _ends_here
        finalize = sink_finalizer(plan, layout) if self.commit.get("sink") else None
        _, sink_result = commit_admitted(plan, layout, payload, try_number=self.commit["try_number"],
                                         clear_number=self.commit["clear_number"], by="triggerer",
                                         finalize_sink=finalize)
        removed, losers = remove_losers(layout, plan["parallelism"], admitted_of(payload))
        if losers and finalize is not None:
            cleanup_sink_staging(plan, layout, losers, self.log)
        summary = payload.get("summary", {})
        StageMetrics.for_plan(plan).emit(summary, only_changed=False)
        self.log.info("stage %s committed %d subtasks in the triggerer (removed %d losing outputs); "
                      "numSlowExecutionVertices=%s numEffectiveSpeculativeExecutions=%s", plan["stage"],
                      len(payload["admitted"]), removed, summary.get("numSlowExecutionVertices"),
                      summary.get("numEffectiveSpeculativeExecutions"))
        return commit_summary(plan["stage"], layout, sink_result, summary)

    def timed_out(self) -> bool:
        """Whether the task's trigger timeout passed (Airflow sets ``timeout_after`` from ``execution_timeout``)."""
        deadline: dt.datetime | None = getattr(self, "timeout_after", None)
        if deadline is None:
            return False
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=dt.UTC)
        return dt.datetime.now(dt.UTC) >= deadline

    async def _stop_attempts(self) -> str:
        """Stop every attempt of the stage and record the task as failed by its timeout; the reason given."""
        assert self._running is not None
        plan, env, target_env = self._running
        reason = (f"pipeline {plan.get('pipeline')!r}, stage {plan['stage']!r}: the task's execution_timeout "
                  f"passed (at {getattr(self, 'timeout_after', None)}); every attempt of the stage was stopped")
        if not self._stopped:
            self._stopped = True
            self.log.error("%s", reason)
            controller = self._controller
            if controller is not None:
                await asyncio.to_thread(controller.kill_all, "execution_timeout")
            else:
                await asyncio.to_thread(kill_stage, plan, "execution_timeout", extra_env=env, target_env=target_env)
            # The layout opens its store in the thread too: a first open may read an Airflow connection.
            await asyncio.to_thread(lambda: record_task_state(StageLayout.of_plan(plan), TaskState.FAILED,
                                                              reason=reason))
        return reason

    async def cleanup(self) -> None:
        """After a timeout Airflow cancels the trigger without on_kill: stop the attempts here instead.

        A trigger cancelled for any other reason (a triggerer shutting down hands the stage to another
        one) leaves its attempts running.
        """
        if self._running is not None and self.timed_out():
            await self._stop_attempts()

    async def _kill_env(self, plan: StagePlan) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """The secrets stopping the attempts needs (Connect tokens, sink connections): the run's, else resolved now.

        A connection that cannot be resolved leaves its part empty: the kill still goes on with what the
        store recorded.
        """
        if self._running is not None:
            return self._running[1], self._running[2]
        try:
            env = await self._attempt_env(plan)
        except Exception as exc:
            self.log.warning("stage %s: stopping without the sink's connection: %s", plan["stage"], type(exc).__name__)
            env = {}
        try:
            target_env = await connect_env(plan)
        except Exception as exc:
            self.log.warning("stage %s: stopping without the Connect targets' connections: %s", plan["stage"],
                             type(exc).__name__)
            target_env = {}
        return env, target_env

    async def on_kill(self) -> None:
        """The task was stopped from outside (marked success or failed, cleared, its run deleted): stop its drivers.

        Airflow does not tell the trigger which, so the task state says ``killed``, not ``failed``.
        """
        plan = await asyncio.to_thread(self._plan)
        env, target_env = await self._kill_env(plan)
        await asyncio.to_thread(kill_stage, plan, "task killed by user", extra_env=env, target_env=target_env)
        await asyncio.to_thread(lambda: record_task_state(
            StageLayout.of_plan(plan), TaskState.KILLED,
            reason="stopped from outside: marked success or failed, cleared, or its DAG run deleted"))


def _iso(moment: Any) -> str | None:
    """A datetime as ISO 8601 (the listener's nominal times); None stays None."""
    return moment.isoformat() if moment is not None and hasattr(moment, "isoformat") else None


def _driver_log_lines(logs: DriverLogStream | None, controller: StageController, final: bool) -> list[str]:
    """What the attempts' driver logs add to the task log this step (none when streaming is off)."""
    now = time.time()
    if logs is None or not logs.due(now, final):
        return []
    # Built only when due: an early step woken by a change notice does not walk every attempt for nothing.
    return logs.step(controller.scheduler.all_attempts(), now, final=final)
