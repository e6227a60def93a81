"""Test DAGs on Spark Connect targets (servers started by tests/integration/test_connect_spark.py).

``connect_q1`` is ``small_q1`` on Connect targets; ``connect_cancel`` runs a copy of its only subtask
at once (fault injection: ``tests/integration/dag_faults.py``, ``CONNECT_CANCEL``), and the original (a
query sleeping in a UDF on the server) must be cancelled when it loses. ``connect_timeout`` is
``connect_cancel`` with an ``execution_timeout`` its attempts cannot meet.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

HERE = Path(__file__).resolve().parent
APPS = HERE.parents[2] / "dags" / "apps"
DATA = os.environ["SPECULATIVE_EXAMPLE_DATA"]
TARGETS = [{"name": "connect-a", "conn_id": "spark_connect_test_a", "slots": 2},
           {"name": "connect-b", "conn_id": "spark_connect_test_b", "slots": 2}]

with DAG(dag_id="connect_q1", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
        Pipeline("connect_q1", config={"check_interval": "500ms", "targets": TARGETS},
                 spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
    scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=2,
                          inputs={"lineitem": parquet_source(DATA)})
    pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                   inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
                   sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + "/connect_q1/{{ ds }}"))

for dag_id, timeout in (("connect_cancel", None), ("connect_timeout", timedelta(seconds=40))):
    with DAG(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
            Pipeline(dag_id, config={
                "enabled": True, "check_interval": "300ms", "max_concurrent_executions": 2,
                "targets": [{**TARGETS[0], "slots": 1}, {**TARGETS[1], "slots": 1}]},
                spark_conf={"spark.sql.shuffle.partitions": "2"}) as pipeline:
        pipeline.stage("count", application=str(HERE.parent / "apps" / "slow_first_attempt.py"), parallelism=1,
                       inputs={"lineitem": parquet_source(DATA)}, execution_timeout=timeout, retries=0)
