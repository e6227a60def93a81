"""Race DAGs: every subtask runs two attempts whose ends are released together, for each sink kind.

The two attempts and their held ends are fault injection (``tests/integration/dag_faults.py``, ``RACE_SINKS``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import Pipeline, parquet_source
from airflow_provider_speculative.sinks import ParquetSink, PostgresSink

HERE = Path(__file__).resolve().parent
# The unmarked sink is a top-level module so the Spark driver can import it from spark.submit.pyFiles.
sys.path.insert(0, str(HERE))
from unmarked_sink import UnmarkedParquetSink  # noqa: E402

APP = str(HERE.parent / "apps" / "passthrough.py")
DATA = os.environ.get("SPECULATIVE_RACE_DATA", "/nonexistent")
OUTPUT = os.environ["SPECULATIVE_EXAMPLE_OUTPUT"]
PARALLELISM = 2  # 2 subtasks x 2 attempts: 4 concurrent drivers; dag_faults.RACE_SINKS forces each pair
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}
RACE = {
    "enabled": True,
    "max_concurrent_executions": 2,
    "targets": [{"name": "local-a", "slots": PARALLELISM, "conf": {"spark.ui.enabled": "false"}},
                {"name": "local-b", "slots": PARALLELISM, "conf": {"spark.ui.enabled": "false"}}],
}
# race_connect: the Parquet sink's race on the suite's Connect servers (test_s3_faults.py, the store on S3).
CONNECT_RACE = {**RACE, "targets": [{"name": "connect-a", "conn_id": "spark_connect_test_a", "slots": PARALLELISM},
                                    {"name": "connect-b", "conn_id": "spark_connect_test_b", "slots": PARALLELISM}]}
SINKS = {
    "race_parquet": ParquetSink(OUTPUT + "/race_parquet/{{ ds }}"),
    "race_postgres": PostgresSink(os.environ.get("SPECULATIVE_RACE_TABLE", "race_results"),
                                  postgres_conn_id="postgres_race",
                                  staging_schema=os.environ.get("SPECULATIVE_RACE_STAGING", "speculative_staging"),
                                  ledger_table=os.environ.get("SPECULATIVE_RACE_STAGING", "speculative_staging")
                                  + ".commits"),
}

for dag_id, sink in SINKS.items():
    with DAG(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
            Pipeline(dag_id, config=RACE, spark_conf=SHUFFLE) as pipeline:
        pipeline.stage("write", application=APP, parallelism=PARALLELISM,
                       inputs={"rows": parquet_source(DATA)}, sink=sink)

with DAG(dag_id="race_connect", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
        Pipeline("race_connect", config=CONNECT_RACE, spark_conf=SHUFFLE) as pipeline:
    pipeline.stage("write", application=APP, parallelism=PARALLELISM, inputs={"rows": parquet_source(DATA)},
                   sink=ParquetSink(OUTPUT + "/race_connect/{{ ds }}"))

with DAG(dag_id="race_unmarked", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
        Pipeline("race_unmarked", config=RACE, spark_conf=SHUFFLE) as pipeline:
    pipeline.stage("write", application=APP, parallelism=2, inputs={"rows": parquet_source(DATA)},
                   sink=UnmarkedParquetSink(OUTPUT + "/race_unmarked/{{ ds }}"),
                   spark_conf={"spark.submit.pyFiles": str(HERE / "unmarked_sink.py")})
