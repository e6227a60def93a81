"""Example: TPC-H Q18 (large volume customers: orders of more than 300 units, top 100 by price) as six stages.

The line items' quantities are summed per order in the scan (a partial sum per split), merged per
order key in big_orders together with the orders (both ``all_to_all`` on the order key), and the
big orders meet their customers on the customer key; a final stage picks the global top 100 and
writes it with a Parquet sink.

The pipeline sets no max_parallelism: ``default_max_parallelism=8`` gives every stage 8 hash
subpartitions, so the producers of each join are co-partitioned (docs/joins.md).

Data: ``make data-q3`` (customer, orders, lineitem) under SPECULATIVE_EXAMPLE_TPCH (default: the
parent of SPECULATIVE_EXAMPLE_DATA, the lineitem directory).
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


def q18_pipeline(tpch: str, lineitem: str | None = None, output: str | None = None) -> Pipeline:
    """Q18's stages over ``tpch``/<table> (lineitem from ``lineitem`` if given); a Parquet sink under ``output``."""
    p = Pipeline("tpch_q18", default_max_parallelism=8, spark_conf={"spark.sql.shuffle.partitions": "4"})
    quantities = p.stage("scan_lineitem", application=str(APPS / "q18_scan_lineitem.py"), parallelism=8,
                         inputs={"lineitem": parquet_source(lineitem or tpch + "/lineitem")})
    orders = p.stage("scan_orders", application=str(APPS / "q18_scan_orders.py"), parallelism=4,
                     inputs={"orders": parquet_source(tpch + "/orders")})
    customers = p.stage("scan_customer", application=str(APPS / "q18_scan_customer.py"), parallelism=2,
                        inputs={"customer": parquet_source(tpch + "/customer")})
    big = p.stage("big_orders", application=str(APPS / "q18_big_orders.py"), parallelism=4,
                  inputs={"quantities": all_to_all(quantities, key="l_orderkey"),
                          "orders": all_to_all(orders, key="o_orderkey")})
    top = p.stage("join_customer", application=str(APPS / "q18_join_customer.py"), parallelism=2,
                  inputs={"orders": all_to_all(big, key="o_custkey"),
                          "customer": all_to_all(customers, key="c_custkey")})
    p.stage("top", application=str(APPS / "q18_top.py"), parallelism=1,
            inputs={"candidates": all_to_all(top, key="o_orderkey")},
            sink=ParquetSink(output + "/tpch_q18/{{ ds }}") if output else None)
    return p


with DAG(
    dag_id="tpch_q18",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example"],
):
    q18_pipeline(TPCH, LINEITEM, OUTPUT).compile()
