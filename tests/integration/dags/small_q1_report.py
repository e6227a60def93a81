"""Test DAG: reads small_q1's committed aggregate once a StageOutputSensor sees it (as dags/tpch_q1_report.py)."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_speculative import StageOutputSensor

with DAG(dag_id="small_q1_report", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    found = StageOutputSensor(task_id="wait_for_small_q1", external_dag_id="small_q1", stage="aggregate",
                              poke_interval=1, timeout=120, deferrable=True)

    @task
    def report(found: dict[str, Any]) -> dict[str, Any]:
        """Row count of the committed Q1 output, read from the sink's directory."""
        import pyarrow.parquet as pq

        from airflow_provider_speculative.store.files import read_json

        path = read_json(found["committed"])["sink"]["path"]
        return {"run_id": found["run_id"], "rows": pq.read_table(path).num_rows, "path": path}

    report(found.output)
