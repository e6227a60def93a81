"""Test DAG: the example's Q1 applications, small (2 scan subtasks, 1 aggregate), no speculation."""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

APPS = Path(__file__).resolve().parents[3] / "dags" / "apps"

with DAG(dag_id="small_q1", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
        Pipeline("small_q1", config={"check_interval": "500ms"},
                 spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
    scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=2,
                          inputs={"lineitem": parquet_source(os.environ["SPECULATIVE_EXAMPLE_DATA"])})
    pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                   inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
                   sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + "/small_q1/{{ ds }}"))
