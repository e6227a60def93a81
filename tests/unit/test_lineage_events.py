"""OpenLineage events of stage task tries that end in the triggerer (control/lineage_events.py).

Events go through Airflow's real ``OpenLineageAdapter`` into a capturing transport, so what is checked is
what a lineage backend would receive: types, job names, run ids equal to the ones Airflow's provider
computes for the task try (the attempts' injected parent), the parent facet naming the DAG run, datasets
and their facets from a stage committed in a tmp store, no secret anywhere, and no error ever raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter
from airflow.triggers.base import TaskSuccessEvent
from openlineage.client import OpenLineageClient
from openlineage.client.serde import Serde
from openlineage.client.transport import Transport

from airflow_provider_speculative.control import lineage_events
from airflow_provider_speculative.control.lineage_events import TaskEnd, emit_task_end, report_task_end
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.faults import NO_FAULTS
from airflow_provider_speculative.core.plan import PLAN_VERSION
from airflow_provider_speculative.hooks import openlineage as ol_hooks
from airflow_provider_speculative.sinks.parquet import ParquetSink
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.manifest import build_manifest, write_manifest
from airflow_provider_speculative.store.results import admitted_results, write_committed
from airflow_provider_speculative.triggers import controller as trigger_module
from airflow_provider_speculative.triggers.controller import StageControllerTrigger

SECRET = "hunter2-secret"
LOGICAL_DATE = "2026-02-11T00:00:00+00:00"
SCHEMA = {"type": "struct", "fields": [
    {"name": "l_returnflag", "type": "string", "nullable": True, "metadata": {}},
    {"name": "sum_qty", "type": "decimal(25,2)", "nullable": True, "metadata": {}},
    {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True}, "nullable": True,
     "metadata": {}}]}


class CapturingTransport(Transport):
    """Keeps every event it is given, as JSON documents (what an HTTP backend would receive)."""

    kind = "capturing"

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: Any) -> None:
        self.events.append(json.loads(Serde.to_json(event)))


@pytest.fixture
def transport() -> CapturingTransport:
    return CapturingTransport()


@pytest.fixture
def adapter(transport: CapturingTransport) -> OpenLineageAdapter:
    return OpenLineageAdapter(client=OpenLineageClient(transport=transport))


def _plan(root: Path, stage: str, inputs: dict[str, Any], **keys: Any) -> dict[str, Any]:
    return {"version": PLAN_VERSION, "dag_id": "q1", "run_id": "manual__1", "stage": stage, "task_id": stage,
            "store_root": str(root), "parallelism": 1, "subtasks": [{}], "config": {}, "fingerprint": "f1",
            "output": {"sink": None}, "targets": {}, "inputs": inputs, "try_number": 3, "clear_number": 1,
            "logical_date": LOGICAL_DATE, **keys}


@pytest.fixture
def committed_run(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run of ``q1``: ``scan`` (its source URL carries a password) and ``aggregate``, committed with 2 subtasks."""
    root = tmp_path / "store"
    scan = _plan(root, "scan", {"rows": {"kind": "source", "path": f"hdfs://etl:{SECRET}@nn:8020/data/lineitem"}})
    aggregate = _plan(root, "aggregate", {"partials": {"kind": "exchange", "upstream": "scan"}}, parallelism=2,
                      subtasks=[{}, {}])
    for plan in (scan, aggregate):
        atomic_write_json(StageLayout.of_plan(plan).plan, plan)
    layout = StageLayout.of_plan(aggregate)
    for subtask, records in ((0, 4), (1, 2)):
        data = layout.data(subtask, 0)
        data.mkdir(parents=True)
        (data / "part-0.parquet").write_bytes(b"x" * (10 * records))
        write_manifest(layout.manifest(subtask, 0), build_manifest(data, schema=SCHEMA, records=records))
    write_committed(layout, admitted_results(layout, {0: 0, 1: 0}))
    return scan, aggregate


def _ids(plan: dict[str, Any]) -> tuple[str, str]:
    """The task try's and DAG run's run ids as Airflow's OpenLineage provider computes them."""
    moment = datetime.fromisoformat(LOGICAL_DATE)
    return (OpenLineageAdapter.build_task_instance_run_id(dag_id="q1", task_id=plan["task_id"], try_number=3,
                                                          logical_date=moment, map_index=-1),
            OpenLineageAdapter.build_dag_run_id(dag_id="q1", logical_date=moment, clear_number=1))


def _end(**kw: Any) -> TaskEnd:
    return TaskEnd(**{"ran_on_worker": False, "ended_in_triggerer": True, "succeeded": True,
                      "started_at": time.time() - 60, **kw})


def test_a_try_started_and_ended_in_the_triggerer_gets_start_and_complete_as_the_listener_names_them(
        committed_run: tuple[dict[str, Any], dict[str, Any]], adapter: OpenLineageAdapter,
        transport: CapturingTransport) -> None:
    _, aggregate = committed_run
    sink = ParquetSink("/out/q1/{{ ds }}")

    assert emit_task_end(aggregate, _end(), sink=sink, adapter=adapter) == ["START", "COMPLETE"]

    start, complete = transport.events
    assert [start["eventType"], complete["eventType"]] == ["START", "COMPLETE"]
    run_id, dag_run_id = _ids(aggregate)
    for event in (start, complete):
        assert event["job"]["name"] == "q1.aggregate"
        assert event["run"]["runId"] == run_id
        parent = event["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == dag_run_id and parent["job"]["name"] == "q1"
        assert event["job"]["facets"]["jobType"]["jobType"] == "TASK"
    assert start["eventTime"] < complete["eventTime"]  # START is when the controller started the stage
    assert {(d["namespace"], d["name"]) for d in complete["inputs"]} == {
        ("hdfs://nn:8020", "data/lineitem"), ("speculative", "q1/scan")}
    (output,) = complete["outputs"]
    assert (output["namespace"], output["name"]) == ("file", "/out/q1")  # the asset's dataset, not one per date
    assert [(f["name"], f["type"]) for f in output["facets"]["schema"]["fields"]] == [
        ("l_returnflag", "string"), ("sum_qty", "decimal(25,2)"), ("tags", "array")]
    stats = output["outputFacets"]["outputStatistics"]
    assert (stats["rowCount"], stats["size"], stats["fileCount"]) == (6, 60, 2)


def test_a_try_a_worker_started_gets_only_its_terminal_event(
        committed_run: tuple[dict[str, Any], dict[str, Any]], adapter: OpenLineageAdapter,
        transport: CapturingTransport) -> None:
    scan, _ = committed_run
    assert emit_task_end(scan, _end(ran_on_worker=True), adapter=adapter) == ["COMPLETE"]
    (complete,) = transport.events
    assert complete["eventType"] == "COMPLETE" and complete["run"]["runId"] == _ids(scan)[0]
    assert complete["job"]["name"] == "q1.scan"
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [("speculative", "q1/scan")]
    assert "outputStatistics" not in complete["outputs"][0].get("outputFacets", {})  # scan was never committed


def test_a_try_that_resumes_on_a_worker_is_left_to_airflows_listener(
        committed_run: tuple[dict[str, Any], dict[str, Any]], adapter: OpenLineageAdapter,
        transport: CapturingTransport) -> None:
    _, aggregate = committed_run
    for ran_on_worker in (False, True):
        for succeeded in (False, True):
            end = _end(ran_on_worker=ran_on_worker, ended_in_triggerer=False, succeeded=succeeded)
            assert emit_task_end(aggregate, end, adapter=adapter) == []
    assert transport.events == []


def test_a_failure_ended_in_the_triggerer_carries_a_bounded_printable_error_without_credentials(
        committed_run: tuple[dict[str, Any], dict[str, Any]], adapter: OpenLineageAdapter,
        transport: CapturingTransport) -> None:
    scan, _ = committed_run
    error = f"sink postgres://loader:{SECRET}@db:5432/sales refused\x1b[2J\r\n" + "x" * 20_000
    assert emit_task_end(scan, _end(succeeded=False, error=error), adapter=adapter) == ["START", "FAIL"]
    fail = transport.events[-1]
    message = fail["run"]["facets"]["errorMessage"]["message"]
    assert message.startswith("sink postgres://***@db:5432/sales refused\\x1b[2J\\x0d\n")
    assert len(message) < 4100 and message.endswith("more characters)")


def test_no_secret_reaches_any_event(committed_run: tuple[dict[str, Any], dict[str, Any]],
                                     adapter: OpenLineageAdapter, transport: CapturingTransport) -> None:
    scan, aggregate = committed_run
    emit_task_end(scan, _end(), adapter=adapter)
    emit_task_end(aggregate, _end(succeeded=False, error=f"s3a://AKIA:{SECRET}@lake/x failed"), adapter=adapter)
    emit_task_end(aggregate, _end(dag_run_conf={"note": "x"}), adapter=adapter)
    assert len(transport.events) == 6
    assert SECRET not in json.dumps(transport.events)


class RaisingAdapter(OpenLineageAdapter):
    def start_task(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"cannot reach http://user:{SECRET}@lineage.example/api")


def test_an_adapter_or_transport_failure_is_one_log_line_never_an_error(
        committed_run: tuple[dict[str, Any], dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    scan, _ = committed_run
    caplog.set_level(logging.WARNING)
    assert emit_task_end(scan, _end(), adapter=RaisingAdapter(client=OpenLineageClient(transport=CapturingTransport()))
                         ) == []
    (record,) = [r for r in caplog.records if "OpenLineage" in r.getMessage()]
    assert "RuntimeError" in record.getMessage() and SECRET not in record.getMessage() and record.exc_info is None

    class Down(Transport):
        kind = "down"

        def emit(self, event: Any) -> None:
            raise ConnectionError("lineage backend down")

    # Airflow's adapter logs a transport's failure itself; the event types are still reported as attempted.
    assert emit_task_end(scan, _end(), adapter=OpenLineageAdapter(client=OpenLineageClient(transport=Down()))) == [
        "START", "COMPLETE"]
    # A plan from before task ids were recorded names no task run: nothing is sent, nothing raised.
    transport = CapturingTransport()
    old = {k: v for k, v in scan.items() if k != "task_id"}
    assert emit_task_end(old, _end(), adapter=OpenLineageAdapter(client=OpenLineageClient(transport=transport))) == []
    assert transport.events == []


def test_a_slow_backend_holds_the_trigger_no_longer_than_the_timeout(
        committed_run: tuple[dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    scan, _ = committed_run
    release = threading.Event()
    entered = threading.Event()

    class Stuck(Transport):
        kind = "stuck"

        def emit(self, event: Any) -> None:
            entered.set()
            release.wait(30)

    stuck = OpenLineageAdapter(client=OpenLineageClient(transport=Stuck()))
    monkeypatch.setattr(lineage_events, "openlineage_adapter", lambda plan: stuck)

    async def report() -> float:
        began = time.monotonic()
        await report_task_end(scan, _end(), timeout=0.2)
        return time.monotonic() - began

    try:
        waited = asyncio.run(report())
        assert entered.is_set() and waited < 5  # the transport still hangs: the trigger went on without it
    finally:
        release.set()
        for thread in threading.enumerate():  # the send finishes once released: not left to another test
            if thread.name == "openlineage-emit":
                thread.join(10)


def test_disabled_or_turned_off_openlineage_sends_nothing_and_injects_no_parent(
        committed_run: tuple[dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.openlineage import conf as ol_conf

    scan, _ = committed_run
    monkeypatch.setattr(ol_conf, "spark_inject_parent_job_info", lambda: True)
    monkeypatch.setattr(ol_conf, "spark_inject_transport_info", lambda: False)
    monkeypatch.setattr(ol_conf, "is_disabled", lambda: False)
    run_id, _ = _ids(scan)
    assert ol_hooks.openlineage_spark_conf(scan)["spark.openlineage.parentRunId"] == run_id  # type: ignore[arg-type]
    # An emission policy that turns the task's events off: no events, so no parent that would never report.
    monkeypatch.setattr(ol_hooks, "_task_events_emitted", lambda dag_id, task_id: False)
    assert ol_hooks.openlineage_adapter(scan) is None  # type: ignore[arg-type]
    assert ol_hooks.openlineage_spark_conf(scan) == {}  # type: ignore[arg-type]
    assert emit_task_end(scan, _end()) == []
    monkeypatch.setattr(ol_hooks, "_task_events_emitted", lambda dag_id, task_id: True)
    monkeypatch.setattr(ol_conf, "is_disabled", lambda: True)
    assert ol_hooks.openlineage_spark_conf(scan) == {}  # type: ignore[arg-type]
    assert emit_task_end(scan, _end()) == []


def test_the_emission_policy_turns_a_tasks_events_and_parent_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__EMISSION_POLICY", json.dumps([
        {"scope": {"dag_id": "q1", "task_id": "scan"}, "controls": {"emit": False}},
        {"scope": {"operator": ol_hooks.STAGE_OPERATOR}, "controls": {"emit": False}},
        {"scope": {"dag_id": "q3"}, "controls": {"emit": True}}]))
    assert not ol_hooks._task_events_emitted("q1", "scan")
    assert not ol_hooks._task_events_emitted("q2", "any")  # the operator rule
    assert ol_hooks._task_events_emitted("q3", "join")  # a DAG rule outranks an operator rule


def test_the_attempts_parent_is_the_run_the_events_report(
        committed_run: tuple[dict[str, Any], dict[str, Any]], adapter: OpenLineageAdapter,
        transport: CapturingTransport) -> None:
    _, aggregate = committed_run
    props = ol_hooks.parent_job_properties(aggregate, "default", adapter)  # type: ignore[arg-type]
    emit_task_end(aggregate, _end(), adapter=adapter)
    assert {e["run"]["runId"] for e in transport.events} == {props["spark.openlineage.parentRunId"]}
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in transport.events} == {
        props["spark.openlineage.rootParentRunId"]}
    assert {e["job"]["name"] for e in transport.events} == {props["spark.openlineage.parentJobName"]}


# -- the controller trigger ------------------------------------------------------------------


class DecidedController:
    """A stage decided at once: subtask 0 and 1 admitted attempt 0 (the committed run's aggregate)."""

    @classmethod
    def open(cls, plan: dict[str, Any], **kwargs: Any) -> DecidedController:
        return cls(plan)

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.layout = StageLayout.of_plan(plan)
        self.config = SpeculativeConfig(check_interval=0.0, driver_log_lines=0)
        self.faults = NO_FAULTS
        self.done = True
        self.succeeded = type(self).succeeded_stage

    succeeded_stage = True

    def step(self) -> list[Any]:
        return []

    def summary(self) -> dict[str, Any]:
        return {}

    def attempt_lines(self) -> list[str]:
        return []

    def event_payload(self) -> dict[str, Any]:
        status = "success" if self.succeeded else "failed"
        return {"status": status, "plan_path": str(self.layout.plan), "admitted": {"0": 0, "1": 0}, "summary": {}}


class StartedInTriggerer(StageControllerTrigger):
    """As StageStartTrigger: no worker ran the try before the trigger."""

    def needs_guard(self) -> bool:
        return False


@pytest.mark.parametrize(("trigger_class", "in_line", "succeeded", "expected"), [
    (StageControllerTrigger, False, True, ["COMPLETE"]),  # a worker started it: the listener sent START
    (StartedInTriggerer, False, True, ["START", "COMPLETE"]),
    (StageControllerTrigger, True, True, []),  # dag.test(): the task resumes on the worker
    (StartedInTriggerer, False, False, []),  # a failure resumes on a worker, which reports it
])
def test_the_trigger_reports_exactly_what_ends_in_the_triggerer(
        committed_run: tuple[dict[str, Any], dict[str, Any]], adapter: OpenLineageAdapter,
        transport: CapturingTransport, monkeypatch: pytest.MonkeyPatch, trigger_class: type[StageControllerTrigger],
        in_line: bool, succeeded: bool, expected: list[str]) -> None:
    _, aggregate = committed_run
    layout = StageLayout.of_plan(aggregate)
    layout.committed.unlink()  # the trigger commits it
    monkeypatch.setattr(DecidedController, "succeeded_stage", succeeded)
    monkeypatch.setattr(trigger_module, "StageController", DecidedController)
    monkeypatch.setattr(trigger_module, "runs_in_line", lambda: in_line)
    monkeypatch.setattr(trigger_module, "min_seconds_before_event", lambda: 0.0)
    monkeypatch.setattr(lineage_events, "openlineage_adapter", lambda plan: adapter)

    trigger = trigger_class(plan_path=str(layout.plan), deferred_at=time.time(),
                            commit={"try_number": 3, "clear_number": 1})
    (event,) = asyncio.run(_events(trigger))

    assert isinstance(event, TaskSuccessEvent) == bool(expected)
    assert [e["eventType"] for e in transport.events] == expected
    assert {e["run"]["runId"] for e in transport.events} <= {_ids(aggregate)[0]}
    if expected:
        stats = transport.events[-1]["outputs"][0]["outputFacets"]["outputStatistics"]
        assert stats["rowCount"] == 6  # read from the commit the trigger made


async def _events(trigger: StageControllerTrigger) -> list[Any]:
    return [event async for event in trigger.run()]


def test_a_stage_started_in_the_triggerer_names_its_declared_sinks_dataset() -> None:
    from airflow_provider_speculative.triggers.stage import StageStartTrigger

    sink = ParquetSink("/out/q1/{{ ds }}")
    trigger = StageStartTrigger(graph={}, stage="aggregate", sink_class=sink.to_json()["class"],
                                sink_args={"path": "/out/q1/2026-02-11"}, declared_sink=sink.describe())
    declared = trigger._declared_sink()
    assert isinstance(declared, ParquetSink) and declared.lineage_uri() == "file:///out/q1"
    assert StageControllerTrigger(plan_path="p", deferred_at=0.0)._declared_sink() is None
