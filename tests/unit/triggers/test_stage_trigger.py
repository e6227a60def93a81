"""StageStartTrigger: a stage task started in the triggerer plans there, with the operator's checks and plan."""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from airflow.triggers.base import TaskSuccessEvent

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, broadcast, parquet_source
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.faults import NO_FAULTS
from airflow_provider_speculative.core.graph import PipelineGraph
from airflow_provider_speculative.store.files import read_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.triggers import controller as controller_module
from airflow_provider_speculative.triggers.stage import StageStartTrigger
from tests.factories import FakeTI


def _pipeline(tmp_path: Path, application: str = "app.py", agg_kwargs: dict[str, Any] | None = None,
              **scan_kwargs: Any) -> Pipeline:
    with DAG("d", schedule=None), Pipeline("p") as pipeline:
        scan = pipeline.stage("scan", application=str(tmp_path / application), parallelism=2,
                              inputs={"src": parquet_source(str(tmp_path / "src"))}, **scan_kwargs)
        pipeline.stage("agg", application=str(tmp_path / "app.py"), parallelism=1,
                       inputs={"partials": all_to_all(scan, key=["k"])},
                       sink=ParquetSink(str(tmp_path / "out" / "{{ ds }}")), **(agg_kwargs or {}))
    return pipeline


def _task_instance(stage: str, try_number: int = 1) -> SimpleNamespace:
    dag_run = SimpleNamespace(clear_number=0, logical_date=pendulum.datetime(2026, 1, 1, tz="UTC"), conf={})
    return SimpleNamespace(dag_id="d", run_id="r1", task_id=stage, try_number=try_number,
                           _ti_context_from_server=SimpleNamespace(dag_run=dag_run))


def _trigger(op: Any) -> StageStartTrigger:
    """The trigger as the triggerer builds it: from the serialised start arguments, with its task instance."""
    args = op.start_trigger_args
    module, _, name = args.trigger_cls.rpartition(".")
    kwargs = json.loads(json.dumps(args.trigger_kwargs))
    trigger = getattr(importlib.import_module(module), name)(**kwargs)
    trigger._task_instance = _task_instance(op.task_id)
    return trigger


async def _events(trigger: StageStartTrigger) -> list[Any]:
    return [event async for event in trigger.run()]


def test_graph_json_round_trip_is_equal() -> None:
    with DAG("d", schedule=None), Pipeline("p", config={"check_interval": "500ms"}) as pipeline:
        a = pipeline.stage("a", application="/apps/a.py", parallelism=2, inputs={"s": parquet_source("/data/s")},
                           spark_conf={"spark.x": "1"}, application_args=["--n", "3"])
        b = pipeline.stage("b", application="/apps/b.py", parallelism="auto", min_parallelism=1,
                           inputs={"x": all_to_all(a, key=["k"], mode="hybrid")})
        pipeline.stage("c", application="/apps/c.py", parallelism=2,
                       inputs={"y": all_to_all(b, key=["k"]), "dim": broadcast(parquet_source("/data/d"))},
                       config={"enabled": True}, deterministic=False)
    graph = pipeline.graph()
    rebuilt = PipelineGraph.from_json(json.loads(json.dumps(graph.to_json())))
    assert rebuilt == graph


def test_stages_start_in_the_triggerer_unless_told_otherwise(env: Path) -> None:
    pipeline = _pipeline(env)
    scan, agg = pipeline.stages["scan"].task, pipeline.stages["agg"].task
    assert scan.start_from_trigger and agg.start_from_trigger
    assert scan.start_trigger_args.next_method == "resume_from_trigger"
    assert scan.start_trigger_args.trigger_kwargs["publish"] is False
    assert agg.start_trigger_args.trigger_kwargs["publish"] is True  # the sink's asset: published on a worker
    legacy = _pipeline(env, commit_in_triggerer=False).stages["scan"].task
    assert not legacy.start_from_trigger


def test_serialize_round_trip(env: Path) -> None:
    trigger = _trigger(_pipeline(env).stages["agg"].task)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (classpath, kwargs)
    assert not trigger.needs_guard()


def test_a_planning_error_fails_the_task_on_a_worker_naming_pipeline_and_stage(env: Path) -> None:
    op = _pipeline(env, application="missing.py").stages["scan"].task
    (event,) = asyncio.run(_events(_trigger(op)))
    assert event.payload["status"] == "plan_failed"
    assert "pipeline 'p', stage 'scan'" in event.payload["reason"] and "missing.py" in event.payload["reason"]
    layout = StageLayout(env / "store", "d", "r1", "scan")
    assert read_json(layout.dir / "task.json")["state"] == "failed"  # hybrid consumers fail at once on it
    from airflow_provider_speculative.exceptions import StageFailedError

    with pytest.raises(StageFailedError, match=r"pipeline 'p', stage 'scan'.*missing\.py"):
        op.resume_from_trigger({}, event.payload)


class DecidedController:
    """Every subtask admitted attempt 0 at once (what the real controller decides after the attempts finish)."""

    @classmethod
    def open(cls, plan: dict[str, Any], **kwargs: Any) -> DecidedController:
        return cls(plan, **kwargs)

    def __init__(self, plan: dict[str, Any], *, extra_env: dict[str, str], target_env: dict[str, Any]) -> None:
        self.plan = plan
        self.layout = StageLayout(Path(plan["store_root"]), plan["dag_id"], plan["run_id"], plan["stage"])
        self.config = SpeculativeConfig(check_interval=0.0, driver_log_lines=0)  # a stub has no attempts to tail
        self.faults = NO_FAULTS
        self.done = self.succeeded = True
        for subtask in range(plan["parallelism"]):
            data = self.layout.data(subtask, 0)
            data.mkdir(parents=True)
            pq.write_table(pa.table({"k": [subtask]}), data / "part-0.parquet")
            from airflow_provider_speculative.store.manifest import build_manifest, write_manifest

            write_manifest(self.layout.manifest(subtask, 0), build_manifest(data, records=1))

    def step(self) -> list[Any]:
        return []

    def summary(self) -> dict[str, Any]:
        return {"numSlowExecutionVertices": 0, "numEffectiveSpeculativeExecutions": 0}

    def attempt_lines(self) -> list[str]:
        return ["attempts of stage (stub)"]

    def event_payload(self) -> dict[str, Any]:
        return {"status": "success", "plan_path": str(self.layout.plan),
                "admitted": {str(s): 0 for s in range(self.plan["parallelism"])}, "summary": self.summary()}


def test_a_stage_is_planned_controlled_and_committed_in_the_triggerer(env: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "StageController", DecidedController)
    monkeypatch.setattr(controller_module, "runs_in_line", lambda: False)
    pipeline = _pipeline(env)

    (event,) = asyncio.run(_events(_trigger(pipeline.stages["scan"].task)))
    scan = StageLayout(env / "store", "d", "r1", "scan")
    assert isinstance(event, TaskSuccessEvent)  # no sink, no outlets: the task ends in the triggerer
    assert read_json(scan.plan)["parallelism"] == 2 and read_json(scan.plan)["logical_date"].startswith("2026-01-01")
    assert read_json(scan.committed)["subtasks"]["1"]["attempt"] == 0

    # The consumer plans from the producer's commit, renders its sink path, commits the sink here and resumes
    # on a worker only to publish the asset event.
    agg_op = pipeline.stages["agg"].task
    trigger = _trigger(agg_op)
    trigger.sink_args = {**trigger.sink_args, "path": str(env / "out" / "2026-01-01")}  # as Airflow renders it
    # Started after the scan's commit, the consumer takes it once Airflow says the scan succeeded.
    monkeypatch.setattr(trigger, "_producer_states", lambda planner, producers: {"scan": "success"})
    (event,) = asyncio.run(_events(trigger))
    agg = StageLayout(env / "store", "d", "r1", "agg")
    assert event.payload["status"] == "committed"
    assert (env / "out" / "2026-01-01" / "_SUCCESS").exists()
    assert [e.get("by") for e in map(json.loads, agg.journal.open()) if e["event"] == "finalize_done"] == ["triggerer"]
    outlet = SimpleNamespace(extra=None)
    context = {"outlet_events": {agg_op.sink_asset: outlet}, "ti": FakeTI()}
    result = agg_op.resume_from_trigger(context, event.payload)
    assert result["committed"] == str(agg.committed)
    assert outlet.extra["records"] == 1 and outlet.extra["location"] == str(env / "out" / "2026-01-01")


def test_dag_test_still_plans_on_the_worker(env: Path) -> None:
    op = _pipeline(env).stages["scan"].task
    context = {"dag": SimpleNamespace(dag_id="d"), "run_id": "r2", "ti": SimpleNamespace(try_number=1),
               "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert deferred.value.method_name == "execute_complete"
    assert read_json(deferred.value.trigger.plan_path)["parallelism"] == 2


def test_a_consumer_started_first_waits_for_the_commit_then_plans_on_it(env: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "StageController", DecidedController)
    monkeypatch.setattr(controller_module, "runs_in_line", lambda: False)
    pipeline = _pipeline(env)
    agg_op = pipeline.stages["agg"].task
    assert agg_op.trigger_rule == "always"  # scheduled at the run's start, it waits in the triggerer
    agg = StageLayout(env / "store", "d", "r1", "agg")

    async def scenario() -> list[Any]:
        consumer = asyncio.create_task(_events(_trigger(agg_op)))
        deadline = asyncio.get_running_loop().time() + 30
        while (read_json(agg.dir / "task.json") or {}).get("state") != "waiting":
            assert asyncio.get_running_loop().time() < deadline, "the consumer never started waiting"
            await asyncio.sleep(0.05)
        assert not agg.plan.exists() and not consumer.done()  # no plan before the producer's commit
        assert read_json(agg.dir / "task.json")["reason"] == "for the commits of scan"
        await _events(_trigger(pipeline.stages["scan"].task))  # the producer commits
        return await asyncio.wait_for(consumer, 30)

    (event,) = asyncio.run(scenario())
    assert event.payload["status"] == "committed"
    waited = [e for e in map(json.loads, agg.journal.open()) if e["event"] == "inputs_committed"]
    assert len(waited) == 1 and waited[0]["waited"] >= 0


def test_a_possibly_stale_commit_is_taken_only_once_airflow_says_the_producer_succeeded(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.control.planning import RunInfo, StagePlanner
    from airflow_provider_speculative.exceptions import UpstreamFailedError, UpstreamSkippedError
    from airflow_provider_speculative.store.files import atomic_write_json

    pipeline = _pipeline(env)
    planner = StagePlanner(pipeline.graph(), "agg", sink=None, declared_sink=None,
                           run=RunInfo(dag_id="d", run_id="r1", try_number=1, clear_number=2))
    scan = StageLayout(env / "store", "d", "r1", "scan")
    assert planner.uncommitted_producers() == ["scan"]  # nothing committed
    with pytest.raises(UpstreamFailedError, match=r"'scan' is success in Airflow but has no committed result"):
        planner.uncommitted_producers({"scan": "success"})  # marked success by hand: never waits forever
    atomic_write_json(scan.committed, {"fingerprint": "f", "clear_number": 1, "subtasks": {}})
    assert planner.uncommitted_producers() == ["scan"]  # committed before the last clear: may be replaced
    assert planner.uncommitted_producers({"scan": "running"}) == ["scan"]
    assert planner.uncommitted_producers({"scan": "success"}) == []  # only the consumer was cleared
    atomic_write_json(scan.committed, {"fingerprint": "f", "clear_number": 2, "committed_at": 1.0, "subtasks": {}})
    assert planner.uncommitted_producers() == []  # committed in this clear
    # A trigger does not know the clear number: a commit already there when it started is not taken...
    seen = planner.commit_snapshot()
    assert planner.uncommitted_producers(None, seen) == ["scan"]
    assert planner.uncommitted_producers({"scan": "success"}, seen) == []  # ...unless Airflow says it is current
    atomic_write_json(scan.committed, {"fingerprint": "f", "clear_number": 2, "committed_at": 2.0, "subtasks": {}})
    assert planner.uncommitted_producers(None, seen) == []  # a commit made after the start is the current one
    with pytest.raises(UpstreamFailedError, match=r"pipeline 'p', stage 'agg': producer stage 'scan' is failed"):
        planner.uncommitted_producers({"scan": "failed"})
    with pytest.raises(UpstreamSkippedError, match="'scan' was skipped"):
        planner.uncommitted_producers({"scan": "skipped"})


def test_a_failed_producer_fails_the_waiting_consumer_without_retry(env: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    agg_op = _pipeline(env).stages["agg"].task
    trigger = _trigger(agg_op)
    monkeypatch.setattr(trigger, "_producer_states", lambda planner, producers: {"scan": "upstream_failed"})
    (event,) = asyncio.run(_events(trigger))
    assert event.payload["status"] == "upstream_failed" and "'scan' is upstream_failed" in event.payload["reason"]
    agg = StageLayout(env / "store", "d", "r1", "agg")
    assert read_json(agg.dir / "task.json")["state"] == "failed"
    with pytest.raises(AirflowFailException, match="producer stage 'scan'"):
        agg_op.resume_from_trigger({}, event.payload)


def test_under_dag_test_a_consumer_run_first_waits_for_the_commit(env: Path) -> None:
    from airflow_provider_speculative.triggers.hybrid import HybridInputsTrigger

    pipeline = _pipeline(env)
    context = {"dag": SimpleNamespace(dag_id="d"), "run_id": "r3", "ti": SimpleNamespace(try_number=1),
               "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}
    with pytest.raises(TaskDeferred) as deferred:
        pipeline.stages["agg"].task.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, HybridInputsTrigger) and deferred.value.method_name == "resume_after_inputs"
    assert trigger.check() is None  # the producer has not committed
    from airflow_provider_speculative.store.task_state import record_task_state

    scan = StageLayout(env / "store", "d", "r3", "scan")
    record_task_state(scan, "failed", try_number=1, clear_number=0, reason="boom")
    assert trigger.check()["status"] == "failed" and "producer stage 'scan' failed" in trigger.check()["reason"]


def test_stages_of_hybrid_exchanges_start_on_a_worker(env: Path) -> None:
    with DAG("d", schedule=None), Pipeline("p") as pipeline:
        scan = pipeline.stage("scan", application=str(env / "app.py"), parallelism=2,
                              inputs={"src": parquet_source(str(env / "src"))})
        mid = pipeline.stage("mid", application=str(env / "app.py"), parallelism=2,
                             inputs={"rows": all_to_all(scan, key=["k"], mode="hybrid")})
        pipeline.stage("last", application=str(env / "app.py"), parallelism=1,
                       inputs={"rows": all_to_all(mid, key=["k"])})
    tasks = {name: stage.task for name, stage in pipeline.stages.items()}
    # Hybrid fencing needs the DAG run's clear number, which Airflow gives a worker, not a trigger.
    assert not tasks["scan"].start_from_trigger and not tasks["mid"].start_from_trigger
    assert tasks["last"].start_from_trigger and tasks["last"].trigger_rule == "always"


def test_under_dag_test_a_consumer_that_gives_way_is_not_failed_for_its_own_consumers(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowRescheduleException

    from airflow_provider_speculative.triggers import timing

    monkeypatch.setattr(timing, "runs_in_line", lambda: True)  # dag.test(): one task at a time
    with DAG("d", schedule=None), Pipeline("p") as pipeline:
        scan = pipeline.stage("scan", application=str(env / "app.py"), parallelism=2,
                              inputs={"src": parquet_source(str(env / "src"))})
        mid = pipeline.stage("mid", application=str(env / "app.py"), parallelism=1,
                             inputs={"rows": all_to_all(scan, key=["k"])})
        pipeline.stage("last", application=str(env / "app.py"), parallelism=1,
                       inputs={"rows": all_to_all(mid, key=["k"])})
    context = {"dag": SimpleNamespace(dag_id="d"), "run_id": "r4", "ti": SimpleNamespace(try_number=1),
               "logical_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "dag_run": SimpleNamespace(conf={})}
    with pytest.raises(AirflowRescheduleException):  # picked before scan: it gives way at once
        pipeline.stages["mid"].task.execute(context)
    mid_layout = StageLayout(env / "store", "d", "r4", "mid")
    assert read_json(mid_layout.dir / "task.json")["state"] == "waiting"
    with pytest.raises(AirflowRescheduleException):  # and "last" waits for mid, not fails on it
        pipeline.stages["last"].task.execute(context)


class _Api:
    """hooks.asset_events.AssetEventsApi as the api-server answers (or fails), for the trigger's choice."""

    created: list[dict[str, Any]] = []
    fail = False

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def asset_id(self, uri: str) -> int:
        return 7

    def find_event(self, asset_id: int, since: str, match: Any) -> None:
        return None

    def create_event(self, asset_id: int, extra: dict[str, Any], partition_key: str | None) -> dict[str, Any]:
        from airflow_provider_speculative.hooks.asset_events import AssetApiError

        if _Api.fail:
            raise AssetApiError("POST /api/v2/assets/events answered 503")
        _Api.created.append({"asset_id": asset_id, "extra": extra, "partition_key": partition_key})
        return {"id": len(_Api.created)}

    def close(self) -> None:
        pass


def _api_connection(monkeypatch: pytest.MonkeyPatch, defined: set[str]) -> None:
    from airflow.sdk import BaseHook

    async def aget_connection(conn_id: str) -> Any:
        if conn_id not in defined:
            from airflow.sdk.exceptions import AirflowNotFoundException

            raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")
        return SimpleNamespace(conn_id=conn_id, host="http://api:8080", schema="", port=None, login="publisher",
                               password="pw", extra_dejson={})

    monkeypatch.setattr(BaseHook, "aget_connection", staticmethod(aget_connection))
    monkeypatch.setattr(controller_module, "AssetEventsApi", _Api)
    monkeypatch.setattr(controller_module, "StageController", DecidedController)
    monkeypatch.setattr(controller_module, "runs_in_line", lambda: False)
    _Api.created, _Api.fail = [], False


def _agg_trigger(env: Path, pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> StageStartTrigger:
    asyncio.run(_events(_trigger(pipeline.stages["scan"].task)))
    trigger = _trigger(pipeline.stages["agg"].task)
    trigger.sink_args = {**trigger.sink_args, "path": str(env / "out" / "2026-01-01")}
    monkeypatch.setattr(trigger, "_producer_states", lambda planner, producers: {"scan": "success"})
    return trigger


def test_the_outlets_travel_to_the_trigger_as_plain_assets_or_not_at_all(env: Path) -> None:
    from airflow.sdk import AssetAlias

    agg = _pipeline(env).stages["agg"].task
    assert agg.start_trigger_args.trigger_kwargs["outlet_assets"] == [{"uri": agg.sink_asset.uri, "sink": True}]
    with DAG("d2", schedule=None), Pipeline("p2") as pipeline:
        pipeline.stage("only", application=str(env / "app.py"), parallelism=1,
                       inputs={"src": parquet_source(str(env / "src"))}, sink=ParquetSink(str(env / "o2")),
                       outlets=[AssetAlias("resolved-on-a-worker")])
    # An alias names its asset only on a worker: such a task resumes there to record the event.
    assert pipeline.stages["only"].task.start_trigger_args.trigger_kwargs["outlet_assets"] is None


def test_with_the_api_connection_a_sink_stage_ends_in_the_triggerer(env: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, {"speculative_api"})
    (event,) = asyncio.run(_events(_agg_trigger(env, _pipeline(env), monkeypatch)))
    assert isinstance(event, TaskSuccessEvent)  # no worker run for the asset event
    (created,) = _Api.created
    assert created["extra"]["records"] == 1 and created["extra"]["speculative_commit"] == "d/r1/agg/try-1"
    agg = StageLayout(env / "store", "d", "r1", "agg")
    assert [e["event"] for e in map(json.loads, agg.journal.open())][-1] == "asset_event_recorded"


def test_a_partitioned_sink_names_the_runs_partition_key_in_its_rest_event(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, {"speculative_api"})
    asyncio.run(_events(_agg_trigger(env, _pipeline(env, agg_kwargs={"asset_partitioned": True}), monkeypatch)))
    assert [c["partition_key"] for c in _Api.created] == ["2026-01-01T00:00:00"]  # the logical date's key


def test_a_partitioned_run_passes_its_own_partition_key_on_in_the_rest_event(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, {"speculative_api"})
    trigger = _agg_trigger(env, _pipeline(env, agg_kwargs={"asset_partitioned": True}), monkeypatch)
    trigger._task_instance._ti_context_from_server.dag_run.partition_key = "region=eu"
    asyncio.run(_events(trigger))
    assert [c["partition_key"] for c in _Api.created] == ["region=eu"]


def test_an_api_server_that_refuses_sends_the_task_to_a_worker(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, {"speculative_api"})
    _Api.fail = True
    (event,) = asyncio.run(_events(_agg_trigger(env, _pipeline(env), monkeypatch)))
    assert event.payload["status"] == "committed"  # resume_from_trigger records it on a worker


def test_without_the_default_connection_the_worker_records_the_event(env: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, set())
    (event,) = asyncio.run(_events(_agg_trigger(env, _pipeline(env), monkeypatch)))
    assert event.payload["status"] == "committed" and _Api.created == []


def test_a_named_connection_that_does_not_exist_fails_at_plan(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, {"speculative_api"})
    with DAG("d", schedule=None), Pipeline("p", config={"asset_events_conn_id": "airflow_api"}) as pipeline:
        scan = pipeline.stage("scan", application=str(env / "app.py"), parallelism=2,
                              inputs={"src": parquet_source(str(env / "src"))})
        pipeline.stage("agg", application=str(env / "app.py"), parallelism=1,
                       inputs={"partials": all_to_all(scan, key=["k"])},
                       sink=ParquetSink(str(env / "out" / "{{ ds }}")))
    (event,) = asyncio.run(_events(_agg_trigger(env, pipeline, monkeypatch)))
    assert event.payload["status"] == "plan_failed"
    assert "pipeline 'p', stage 'agg'" in event.payload["reason"] and "'airflow_api'" in event.payload["reason"]
    assert not (env / "out" / "2026-01-01" / "_SUCCESS").exists()  # nothing launched or committed
    assert not StageLayout(env / "store", "d", "r1", "agg").plan.exists()  # failed before it planned


def test_a_broken_connection_fails_a_consumer_before_it_waits_for_producers(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _api_connection(monkeypatch, {"speculative_api"})
    from airflow.sdk import BaseHook

    async def no_credentials(conn_id: str) -> Any:
        return SimpleNamespace(conn_id=conn_id, host="http://api:8080", schema="", port=None, login="",
                               password="", extra_dejson={})

    monkeypatch.setattr(BaseHook, "aget_connection", staticmethod(no_credentials))
    trigger = _trigger(_pipeline(env).stages["agg"].task)  # its producer never ran: it would wait forever
    (event,) = asyncio.run(asyncio.wait_for(_events(trigger), 30))
    assert event.payload["status"] == "plan_failed" and "login and password" in event.payload["reason"]
    assert "pipeline 'p', stage 'agg'" in event.payload["reason"]


def test_the_speed_check_sessions_warm_up_while_the_stage_plans(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.control import speedcheck

    monkeypatch.setattr(controller_module, "StageController", DecidedController)
    monkeypatch.setattr(controller_module, "runs_in_line", lambda: False)
    for name, port in (("A", 15101), ("B", 15102)):
        monkeypatch.setenv(f"AIRFLOW_CONN_SC_{name}", json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                                 "port": port, "password": "tok"}))
    targets = [{"name": n, "conn_id": c} for n, c in (("a", "sc_a"), ("b", "sc_b"), ("c", "spark_default"))]
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__TARGETS", json.dumps(targets))
    scan = StageLayout(env / "store", "d", "r1", "scan")
    prepared: list[tuple[dict[str, str], bool]] = []
    monkeypatch.setattr(speedcheck, "prepare_checks", lambda urls: prepared.append((dict(urls), scan.plan.exists())))

    (event,) = asyncio.run(_events(_trigger(_pipeline(env).stages["scan"].task)))
    assert isinstance(event, TaskSuccessEvent)
    ((urls, planned),) = prepared
    assert sorted(urls) == ["a", "b"] and not planned  # the Connect targets only, before plan.json
    assert urls["a"].startswith("sc://127.0.0.1:15101")
