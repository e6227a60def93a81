"""Example: TPC-H Q3 (customer ⋈ orders ⋈ lineitem, top 10 unshipped orders by revenue) as six stages.

Three scan stages filter and project one table each; two join stages read both sides through
``all_to_all`` exchanges on the join key (equal subpartition ranges on both sides, so a key meets its
partners in one subtask); the last stage picks the global top 10 from every join subtask's local
top 10 and writes it with a Parquet sink.

Data: ``make data-q3`` writes lineitem, customer and orders as 8 Parquet parts each (tpchgen-cli) under
SPECULATIVE_EXAMPLE_TPCH (default: the parent of SPECULATIVE_EXAMPLE_DATA, the lineitem directory).
``bench/plain_q3.py`` is the same query as one plain Spark application.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
APPS = HERE / "apps"
LINEITEM = os.environ.get("SPECULATIVE_EXAMPLE_DATA", str(REPO / ".data" / "tpch" / "lineitem"))
TPCH = os.environ.get("SPECULATIVE_EXAMPLE_TPCH", os.path.dirname(LINEITEM.rstrip("/")))
OUTPUT = os.environ.get("SPECULATIVE_EXAMPLE_OUTPUT", str(REPO / ".demo" / "output"))

with DAG(
    dag_id="tpch_q3",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example"],
):
    with Pipeline("tpch_q3", spark_conf={"spark.sql.shuffle.partitions": "4"}) as pipeline:
        # Both sides of a join must have the same max_parallelism to share key ranges. 8, not the default 32:
        # every producer task writes one file per subpartition, and no consumer here runs more than 4
        # subtasks (bench/README.md measures the write with 8 and 32 subpartitions).
        customers = pipeline.stage("scan_customer", application=str(APPS / "q3_scan_customer.py"), parallelism=2,
                                   max_parallelism=8, inputs={"customer": parquet_source(TPCH + "/customer")})
        orders = pipeline.stage("scan_orders", application=str(APPS / "q3_scan_orders.py"), parallelism=4,
                                max_parallelism=8, inputs={"orders": parquet_source(TPCH + "/orders")})
        lineitem = pipeline.stage("scan_lineitem", application=str(APPS / "q3_scan_lineitem.py"), parallelism=8,
                                  max_parallelism=8, inputs={"lineitem": parquet_source(LINEITEM)})
        building_orders = pipeline.stage(
            "join_orders", application=str(APPS / "q3_join_orders.py"), parallelism=2, max_parallelism=8,
            inputs={"customer": all_to_all(customers, key="c_custkey"),
                    "orders": all_to_all(orders, key="o_custkey")})
        revenue = pipeline.stage(
            "join_lineitem", application=str(APPS / "q3_join_lineitem.py"), parallelism=4, max_parallelism=8,
            inputs={"orders": all_to_all(building_orders, key="o_orderkey"),
                    "lineitem": all_to_all(lineitem, key="l_orderkey")})
        pipeline.stage(
            "top", application=str(APPS / "q3_top.py"), parallelism=1,
            inputs={"candidates": all_to_all(revenue, key="l_orderkey")},
            sink=ParquetSink(OUTPUT + "/tpch_q3/{{ ds }}"))
