"""Example: TPC-H Q1 with a pointwise hybrid chain (FLIP-235): filter -> pre-aggregate -> final aggregate.

``filter`` and ``partial`` are joined by a ``pointwise`` **hybrid** exchange: the ``partial`` task
starts while ``filter`` still runs (its trigger rule is ``always``, set by the pipeline), and its
subtask i is launched as soon as ``filter`` subtask i has an admitted attempt, so a slow filter
subtask delays only its own chain. ``aggregate`` reads ``partial`` through an ordinary blocking
``all_to_all`` exchange. Data and output paths as in ``tpch_q1.py``; ``make data`` writes the parts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source, pointwise

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = os.environ.get("SPECULATIVE_EXAMPLE_DATA", str(REPO / ".data" / "tpch" / "lineitem"))
OUTPUT = os.environ.get("SPECULATIVE_EXAMPLE_OUTPUT", str(REPO / ".demo" / "output"))

with DAG(
    dag_id="tpch_q1_hybrid",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example", "hybrid"],
):
    with Pipeline("tpch_q1_hybrid", spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
        filtered = pipeline.stage(
            "filter",
            application=str(HERE / "apps" / "q1_filter.py"),
            parallelism=8,
            inputs={"lineitem": parquet_source(DATA)},
        )
        partial = pipeline.stage(
            "partial",
            application=str(HERE / "apps" / "q1_scan.py"),  # reads its input as "lineitem"
            parallelism=8,
            inputs={"lineitem": pointwise(filtered, mode="hybrid")},
        )
        pipeline.stage(
            "aggregate",
            application=str(HERE / "apps" / "q1_final.py"),
            parallelism=2,
            inputs={"partials": all_to_all(partial, key=["l_returnflag", "l_linestatus"])},
            sink=ParquetSink(OUTPUT + "/tpch_q1_hybrid/{{ ds }}"),
        )
