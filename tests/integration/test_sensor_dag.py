"""StageOutputSensor under real Airflow (dag.test()): it defers, and fires when the other DAG's commit appears."""

from __future__ import annotations

import threading
from pathlib import Path

import pendulum
import pytest

from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from airflow_provider_speculative.store.results import write_committed
from tests.conftest import TEST_ENV
from tests.integration.spark_helpers import HERE, load_dag, wait_for

pytestmark = pytest.mark.timeout(300)

TRIGGER = "airflow_provider_speculative.triggers.stage_output.StageOutputTrigger"


def _sensor_deferred() -> bool:
    """The sensor's trigger is registered in the metadata database (the task deferred)."""
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(Trigger).filter(Trigger.classpath == TRIGGER).count() > 0


def test_a_deferred_sensor_fires_when_the_upstream_commit_appears(airflow_db: Path) -> None:
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(Trigger).filter(Trigger.classpath == TRIGGER).delete()
    day = pendulum.datetime(2026, 6, 1, tz="UTC")
    store = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
    layout = StageLayout(store, "sensor_upstream", f"manual__{day.isoformat()}", "aggregate")
    atomic_write_json(layout.plan, {"dag_id": "sensor_upstream", "run_id": layout.run_id, "stage": "aggregate",
                                    "logical_date": day.isoformat()})
    failures: list[BaseException] = []

    def upstream_commits_later() -> None:
        try:
            wait_for(_sensor_deferred, 120, "the sensor to defer", interval=0.1)
            write_committed(layout, {"stage": "aggregate", "parallelism": 2, "committed_at": 1.0, "subtasks": {
                str(s): {"attempt": 0, "data": "/d", "files": [], "records": 10 + s} for s in range(2)}})
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    writer = threading.Thread(target=upstream_commits_later, daemon=True)
    writer.start()
    run = load_dag("sensor_report", HERE / "dags").test(logical_date=day)
    writer.join(timeout=60)
    assert not failures, failures
    assert run.state == "success"
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert tis["wait_for_aggregate"].state == "success"
    assert tis["report"].xcom_pull(task_ids="report") == 21
