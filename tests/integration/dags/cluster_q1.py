"""Test DAG: the example's Q1 applications on a Spark standalone cluster, one target per worker (node).

The targets (one per worker, pinned through the worker's node resource) come from the test through
``SPECULATIVE_CLUSTER_TARGETS``; the test slows the second target's node down by fault injection
(``tests/integration/dag_faults.py``, ``cluster_q1``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

APPS = Path(__file__).resolve().parents[3] / "dags" / "apps"
TARGETS = json.loads(os.environ.get("SPECULATIVE_CLUSTER_TARGETS") or "[]")

# Defined only under the cluster test, which sets the targets: every other test loads this folder too.
if TARGETS:
    with DAG(dag_id="cluster_q1", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False), \
            Pipeline("cluster_q1", config={
                "enabled": True,
                "baseline_ratio": 0.5,
                "baseline_lower_bound": "2s",
                "block_slow_node_duration": "10 min",
                "check_interval": "0.5s",
                "targets": TARGETS,
            }, spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
        scan = pipeline.stage("scan", application=str(APPS / "q1_scan.py"), parallelism=2,
                              inputs={"lineitem": parquet_source(os.environ["SPECULATIVE_CLUSTER_DATA"])})
        pipeline.stage("aggregate", application=str(APPS / "q1_final.py"), parallelism=1,
                       inputs={"partials": all_to_all(scan, key=["l_returnflag", "l_linestatus"])},
                       sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + "/cluster_q1/{{ ds }}"))
