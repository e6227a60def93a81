"""Two pipelines with the same stage names in one DAG, each a TaskGroup (``Pipeline(task_group=True)``).

Both are ``connect_q1`` (the example's Q1 on the session's warm Connect pool) with their own sink; run
by tests/integration/test_task_groups_spark.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

HERE = Path(__file__).resolve().parent
APPS = HERE.parents[2] / "dags" / "apps"
DATA = os.environ["SPECULATIVE_EXAMPLE_DATA"]
TARGETS = [{"name": "connect-a", "conn_id": "spark_connect_test_a", "slots": 2},
           {"name": "connect-b", "conn_id": "spark_connect_test_b", "slots": 2}]

with DAG(dag_id="connect_grouped", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    for name in ("east", "west"):
        with Pipeline(name, task_group=True, config={"check_interval": "500ms", "targets": TARGETS},
                      spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
            scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=2,
                                  inputs={"lineitem": parquet_source(DATA)})
            pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                           inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
                           sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"]
                                            + f"/connect_grouped/{name}/{{{{ ds }}}}"))
