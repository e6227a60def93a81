"""Test DAG: a pointwise hybrid chain on Spark Connect targets (servers started by test_hybrid_spark.py).

Run with ``dag.test()``, which runs one task at a time: whichever of the two tasks it picks first,
the run must succeed (a consumer picked before its producer waits in a trigger, then reschedules).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import Pipeline, parquet_source, pointwise

APP = Path(__file__).resolve().parents[1] / "apps" / "passthrough.py"
TARGETS = [{"name": "connect-0", "conn_id": "spark_connect_hybrid_0", "slots": 2},
           {"name": "connect-1", "conn_id": "spark_connect_hybrid_1", "slots": 2}]

if os.environ.get("SPECULATIVE_HYBRID_SOURCE"):
    with DAG(dag_id="hybrid_chain", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
            Pipeline("hybrid_chain", config={"check_interval": "300ms", "targets": TARGETS}) as pipeline:
        scan = pipeline.stage("scan", application=str(APP), parallelism=2,
                              inputs={"rows": parquet_source(os.environ["SPECULATIVE_HYBRID_SOURCE"])})
        pipeline.stage("copy", application=str(APP), parallelism=2, inputs={"rows": pointwise(scan, mode="hybrid")})
