"""An unmodified PySpark script (tests/integration/apps/plain_q1.py) run by SpeculativeSparkSubmitOperator.

The script knows nothing of the provider: it builds its session with ``SparkSession.builder.getOrCreate()``
and writes TPC-H Q1 with ``df.write``. Run by tests/integration/test_spark_submit_operator.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import SpeculativeSparkSubmitOperator

APP = Path(__file__).resolve().parents[1] / "apps" / "plain_q1.py"
OUTPUT = os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + "/unmodified_q1/{{ ds }}"

with DAG("unmodified_q1", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    SpeculativeSparkSubmitOperator(
        task_id="q1", application=str(APP), application_args=[os.environ["SPECULATIVE_EXAMPLE_DATA"], OUTPUT],
        conf={"spark.sql.shuffle.partitions": "4"}, name="plain-q1-{{ ds }}", driver_memory="512m",
        speculative_config={"check_interval": "500ms"})
