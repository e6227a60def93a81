"""Test DAG: a cross-DAG StageOutputSensor (deferrable) and a report task reading the committed record.

``sensor_report`` waits for stage ``aggregate`` of DAG ``sensor_upstream`` at the same logical date; the
test writes that commit into the store itself (no Spark) once the sensor has deferred.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_speculative import StageOutputSensor
from airflow_provider_speculative.store.files import read_json

with DAG(dag_id="sensor_report", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    wait = StageOutputSensor(task_id="wait_for_aggregate", external_dag_id="sensor_upstream", stage="aggregate",
                             subtasks=[0], poke_interval=0.2, timeout=300, deferrable=True)

    @task
    def report(found: dict) -> int:
        """Sum the committed subtasks' record counts."""
        committed = read_json(found["committed"])
        return sum(int(s["records"]) for s in committed["subtasks"].values())

    report(wait.output)
