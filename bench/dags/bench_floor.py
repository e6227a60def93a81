"""bench/warm.py scenario z: one task that does nothing, so ``airflow dags test`` of it costs only Airflow's own."""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("bench_floor", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    EmptyOperator(task_id="nothing")
