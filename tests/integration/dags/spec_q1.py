"""Test DAG: the example's Q1 applications as a 3-subtask scan on two targets.

Its tests slow local-b down by fault injection (``tests/integration/dag_faults.py``, ``SPEC_Q1``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

APPS = Path(__file__).resolve().parents[3] / "dags" / "apps"

with DAG(dag_id="spec_q1", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False), \
        Pipeline("spec_q1", config={
            "enabled": True,
            "baseline_ratio": 0.5,
            "baseline_lower_bound": "2s",
            "block_slow_node_duration": "10 min",
            "targets": [{"name": "local-a", "slots": 2}, {"name": "local-b", "slots": 1}],
        }, spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
    scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=3,
                          inputs={"lineitem": parquet_source(os.environ["SPECULATIVE_EXAMPLE_DATA"])})
    pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                   inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
                   sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + "/spec_q1/{{ ds }}"))
