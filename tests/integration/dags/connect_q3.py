"""The join example (dags/tpch_q3.py) at test size on Spark Connect targets (test_connect_spark.py).

Same six stages and stage applications as the example, fewer subtasks; the tables come from
SPECULATIVE_TEST_TPCH (a tiny tpchgen-cli data set the test generates before parsing this folder).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, parquet_source

APPS = Path(__file__).resolve().parents[3] / "dags" / "apps"
TPCH = os.environ.get("SPECULATIVE_TEST_TPCH", "/nonexistent/tpch")
TARGETS = [{"name": "connect-a", "conn_id": "spark_connect_test_a", "slots": 2},
           {"name": "connect-b", "conn_id": "spark_connect_test_b", "slots": 2}]

with DAG(dag_id="connect_q3", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")), \
        Pipeline("connect_q3", config={"check_interval": "500ms", "targets": TARGETS},
                 spark_conf={"spark.sql.shuffle.partitions": "2"}) as pipeline:
    customers = pipeline.stage("scan_customer", application=str(APPS / "q3_scan_customer.py"), parallelism=1,
                               inputs={"customer": parquet_source(TPCH + "/customer")})
    orders = pipeline.stage("scan_orders", application=str(APPS / "q3_scan_orders.py"), parallelism=2,
                            inputs={"orders": parquet_source(TPCH + "/orders")})
    lineitem = pipeline.stage("scan_lineitem", application=str(APPS / "q3_scan_lineitem.py"), parallelism=2,
                              inputs={"lineitem": parquet_source(TPCH + "/lineitem")})
    building_orders = pipeline.stage(
        "join_orders", application=str(APPS / "q3_join_orders.py"), parallelism=2,
        inputs={"customer": all_to_all(customers, key="c_custkey"), "orders": all_to_all(orders, key="o_custkey")})
    revenue = pipeline.stage(
        "join_lineitem", application=str(APPS / "q3_join_lineitem.py"), parallelism=2,
        inputs={"orders": all_to_all(building_orders, key="o_orderkey"),
                "lineitem": all_to_all(lineitem, key="l_orderkey")})
    pipeline.stage("top", application=str(APPS / "q3_top.py"), parallelism=1,
                   inputs={"candidates": all_to_all(revenue, key="l_orderkey")},
                   sink=ParquetSink(os.environ["SPECULATIVE_EXAMPLE_OUTPUT"] + "/connect_q3/{{ ds }}"))
