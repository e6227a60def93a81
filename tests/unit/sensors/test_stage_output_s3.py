"""StageOutputSensor on a store on S3: the locator reads by name (the in-memory backend as ``s3://``, with every
file-system call on the store refused, and moto's in-process S3), the trigger carries the URL and a connection id
only, and ``store_path`` is checked at parse."""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest

from airflow_provider_speculative import StageOutputSensor
from airflow_provider_speculative.control.stage_output import MAX_REASON, StageOutputLocator
from airflow_provider_speculative.core.states import TaskState
from airflow_provider_speculative.exceptions import PipelineError
from airflow_provider_speculative.store import roots
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import write_committed
from airflow_provider_speculative.store.roots import S3Settings, install_store
from airflow_provider_speculative.store.task_state import record_task_state
from airflow_provider_speculative.triggers.stage_output import StageOutputTrigger
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S3_ROOT = "s3://lake/speculative"
DAY = pendulum.datetime(2026, 1, 1, tz="UTC")
RUN = "manual__2026-01-01T09:13:00+00:00"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSENSORKEY"


@pytest.fixture(autouse=True)
def _fresh_stores() -> Iterator[None]:
    roots.forget_stores()
    yield
    roots.forget_stores()


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> StoreBackend:
    """An S3 root served by the in-memory backend; any file-system call on a path of it fails the test."""
    backend = MemoryBackend(S3_ROOT)
    install_store(backend)
    refuse_store_paths(monkeypatch, S3_ROOT)
    return backend


def planned(store: StoreBackend, run_id: str = RUN, logical_date: Any = DAY) -> StageLayout:
    """The stage's plan.json by name, as planning writes it, with the run's logical date."""
    layout = StageLayout.over(store, "up", run_id, "aggregate")
    layout.replace_json(layout.plan, stage_plan(store.url, dag_id="up", run_id=run_id, stage="aggregate",
                                                logical_date=logical_date.isoformat()))
    return layout


def commit(layout: StageLayout) -> None:
    """The committed record (two subtasks), as finalize writes it by name."""
    write_committed(layout, {"stage": layout.stage, "parallelism": 2, "committed_at": 1.0, "subtasks": {
        str(s): {"attempt": 0, "data": "d", "files": [{"path": "p", "size": 5, "subpartition": s}], "records": 1}
        for s in range(2)}})


def test_the_locator_waits_then_finds_the_commit_on_s3(store: StoreBackend) -> None:
    locator = StageOutputLocator(S3_ROOT, "up", "aggregate", logical_date=DAY.isoformat())
    absent = locator.check()
    assert not absent.ready and absent.run_id is None and "no run of that DAG" in absent.message
    planned(store, "scheduled__2025-12-31T00:00:00+00:00", DAY.subtract(days=1))
    layout = planned(store)
    waiting = locator.check()
    assert not waiting.ready and waiting.run_id == RUN and "stage not committed yet" in waiting.message
    commit(layout)
    found = locator.check()
    assert found.ready and found.run_id == RUN
    assert found.committed_path == f"{S3_ROOT}/up/{layout.name(layout.committed).split('/', 1)[1]}"
    assert locator.store is store
    by_run = StageOutputLocator(S3_ROOT, "up", "aggregate", run_id=RUN, subtasks=[0, 1]).check()
    assert by_run.ready and by_run.payload()["committed"] == found.committed_path


@pytest.mark.parametrize("where", ["posix", "s3"])
def test_a_failed_try_is_reported_while_the_sensor_waits(where: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if where == "s3":
        backend: StoreBackend = MemoryBackend(S3_ROOT)
        install_store(backend)
        refuse_store_paths(monkeypatch, S3_ROOT)
        root: str = S3_ROOT
    else:
        root = str(tmp_path / "store")
        backend = roots.open_store(root)
    layout = planned(backend)
    locator = StageOutputLocator(root, "up", "aggregate", logical_date=DAY.isoformat())
    record_task_state(layout, TaskState.FAILED, reason="attempts failed:\n subtask 0 " + "x" * 2 * MAX_REASON)
    observation = locator.check()
    assert not observation.ready  # a retry or a clear may still commit: it keeps waiting
    assert "stage not committed yet; its last try failed: attempts failed: subtask 0 xx" in observation.message
    assert observation.message.endswith("...") and "\n" not in observation.message
    record_task_state(layout, TaskState.DEFERRED)
    assert "last try" not in locator.check().message
    commit(layout)
    assert locator.check().ready


def test_the_trigger_carries_the_url_and_a_connection_id_only(store: StoreBackend) -> None:
    layout = planned(store)
    trigger = StageOutputTrigger(S3_ROOT, "up", "aggregate", logical_date=DAY.isoformat(), poke_interval=0.01,
                                 deadline=time.time() + 60, conn_id="spec_s3")
    classpath, kwargs = trigger.serialize()
    assert kwargs["store_root"] == S3_ROOT and kwargs["conn_id"] == "spec_s3"
    module, _, name = classpath.rpartition(".")
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (classpath, kwargs)
    # Nothing is opened on the event loop: the first look, in a thread, opens the store.
    assert trigger.locator()._store is None
    commit(layout)

    async def first() -> Any:
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first())
    assert event["status"] == "success" and event["committed"].startswith(f"{S3_ROOT}/up/")
    # A trigger serialized before the connection id existed still loads.
    old = {k: v for k, v in kwargs.items() if k != "conn_id"}
    assert StageOutputTrigger(**old).conn_id == ""


def test_the_locator_opens_the_store_with_the_connection_through_the_airflow_layer() -> None:
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    asked: list[str] = []

    def resolver(conn_id: str) -> S3Settings:
        asked.append(conn_id)
        return S3Settings(access_key="AKIDSENSOR", secret_key=SECRET, region="us-east-1",
                          source=f"connection {conn_id!r}")

    roots.resolve_connections_with(resolver)
    try:
        with moto.mock_aws():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="lake")
            writer = roots.open_store(S3_ROOT, credentials=S3Settings(access_key="a", secret_key="b",
                                                                      region="us-east-1"))
            locator = StageOutputLocator(S3_ROOT, "up", "aggregate", logical_date=DAY.isoformat(),
                                         conn_id="spec_s3")
            assert not locator.check().ready
            commit(planned(writer))
            observation = locator.check()
            assert observation.ready and observation.run_id == RUN
            assert asked == ["spec_s3"]  # resolved once, when the locator first opened the store
            assert SECRET not in repr(locator.store) and SECRET not in json.dumps(observation.payload())
    finally:
        from airflow_provider_speculative.settings import connection_credentials

        roots.resolve_connections_with(connection_credentials)


# -- the sensor ------------------------------------------------------------------------------


def sensor(**kwargs: Any) -> StageOutputSensor:
    return StageOutputSensor(**{"task_id": "wait", "external_dag_id": "up", "stage": "aggregate",
                                "deferrable": True, **kwargs})


def context() -> dict[str, Any]:
    ti = SimpleNamespace(try_number=1, get_first_reschedule_date=lambda ctx: None)
    return {"dag": SimpleNamespace(dag_id="down"), "run_id": "down_run", "ti": ti, "logical_date": DAY}


@pytest.mark.parametrize(("store_path", "message"), [
    (f"s3://AKIDX:{SECRET}@lake/x", r"store_path 's3://\*\*\*@lake/x': the URL carries credentials"),
    ("s3://Lake_Bucket/x", r"store_path 's3://Lake_Bucket/x': 'Lake_Bucket' is not an S3 bucket name"),
    ("s3://lake/a/../b", r"store_path 's3://lake/a/\.\./b': the prefix has empty, '\.' or '\.\.' segments"),
    ("s3://lake/x?versionId=1", r"store_path 's3://lake/x\?versionId=1': the URL has a query or fragment"),
    ("gs://lake/x", r"store_path 'gs://lake/x': scheme 'gs://' is not supported; give an absolute local path or "
                    r"an s3://bucket/prefix URL"),
    ("store", r"store_path 'store' is relative"),
    (b"/store", r"store_path must be an absolute path or an s3://bucket/prefix URL, got bytes"),
])
def test_a_bad_store_path_fails_at_parse_naming_the_task(store_path: Any, message: str) -> None:
    with pytest.raises(PipelineError, match=rf"StageOutputSensor 'wait': {message}") as raised:
        sensor(store_path=store_path)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize("store_path", [S3_ROOT, "s3a://lake/speculative/", "s3://lake", "/srv/store",
                                        "{{ var.value.store }}", "s3://{{ var.value.bucket }}/store"])
def test_a_local_path_a_url_or_a_template_is_accepted(store_path: str) -> None:
    assert sensor(store_path=store_path).store_path == store_path


def test_the_sensor_watches_an_s3_store_by_its_url(store: StoreBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__S3_CONN_ID", "spec_s3")
    op = sensor(store_path=S3_ROOT, deferrable=False)
    trigger = op._trigger(context(), None)
    assert (trigger.store_root, trigger.conn_id) == (S3_ROOT, "spec_s3")
    assert not op.poke(context())
    commit(planned(store))
    assert op.poke(context())


def test_the_configured_s3_store_is_the_default(store: StoreBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__EXPERIMENTAL_S3_STORE", "true")
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", S3_ROOT)
    trigger = sensor()._trigger(context(), None)
    assert (trigger.store_root, trigger.conn_id) == (S3_ROOT, "")
    assert sensor(store_path="/srv/store")._trigger(context(), None).store_root == "/srv/store"


def test_a_template_rendered_to_a_bad_store_path_fails_before_any_look() -> None:
    op = sensor(store_path="{{ var.value.store }}")
    op.store_path = "relative/store"  # what rendering produced
    with pytest.raises(PipelineError, match=r"StageOutputSensor 'wait': store_path 'relative/store' is relative"):
        op._trigger(context(), None)
