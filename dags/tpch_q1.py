"""Example: TPC-H Q1 as a two-stage speculative pipeline (scan + pre-aggregate, all_to_all, final aggregate).

Data: ``make data`` writes lineitem as 8 Parquet parts (tpchgen-cli); each part becomes a subtask.
Paths come from SPECULATIVE_EXAMPLE_DATA and SPECULATIVE_EXAMPLE_OUTPUT (defaults under the repo).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = os.environ.get("SPECULATIVE_EXAMPLE_DATA", str(REPO / ".data" / "tpch" / "lineitem"))
OUTPUT = os.environ.get("SPECULATIVE_EXAMPLE_OUTPUT", str(REPO / ".demo" / "output"))

with DAG(
    dag_id="tpch_q1",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example"],
):
    # Few, small shuffles: Spark's 200 default shuffle partitions would be 200 near-empty tasks.
    with Pipeline("tpch_q1", spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
        scan = pipeline.stage(
            "scan",
            application=str(HERE / "apps" / "q1_scan.py"),
            parallelism=8,
            inputs={"lineitem": parquet_source(DATA)},
        )
        pipeline.stage(
            "aggregate",
            application=str(HERE / "apps" / "q1_final.py"),
            parallelism=2,
            inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
            sink=ParquetSink(OUTPUT + "/tpch_q1/{{ ds }}"),
        )
