"""Example: TPC-H Q10 (customers with returned items, top 20 by lost revenue) as six stages.

orders ⋈ lineitem on the order key, then the per-customer revenue ⋈ customer on the customer key
(both through ``all_to_all`` exchanges), with nation read by every join subtask through
``broadcast(parquet_source(...))`` (25 rows: partitioning it would cost an exchange for nothing);
a final stage picks the global top 20 and writes it with a Parquet sink.

The pipeline sets no max_parallelism: ``default_max_parallelism=8`` gives every stage 8 hash
subpartitions, so the producers of each join are co-partitioned (docs/joins.md).

Data: ``make data-tpch`` (tpchgen-cli, 8 Parquet parts per table) under SPECULATIVE_EXAMPLE_TPCH
(default: the parent of SPECULATIVE_EXAMPLE_DATA, the lineitem directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_speculative import ParquetSink, Pipeline, all_to_all, broadcast, parquet_source

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
APPS = HERE / "apps"
LINEITEM = os.environ.get("SPECULATIVE_EXAMPLE_DATA", str(REPO / ".data" / "tpch" / "lineitem"))
TPCH = os.environ.get("SPECULATIVE_EXAMPLE_TPCH", os.path.dirname(LINEITEM.rstrip("/")))
OUTPUT = os.environ.get("SPECULATIVE_EXAMPLE_OUTPUT", str(REPO / ".demo" / "output"))


def q10_pipeline(tpch: str, lineitem: str | None = None, output: str | None = None) -> Pipeline:
    """Q10's stages over ``tpch``/<table> (lineitem from ``lineitem`` if given); a Parquet sink under ``output``."""
    p = Pipeline("tpch_q10", default_max_parallelism=8, spark_conf={"spark.sql.shuffle.partitions": "4"})
    orders = p.stage("scan_orders", application=str(APPS / "q10_scan_orders.py"), parallelism=4,
                     inputs={"orders": parquet_source(tpch + "/orders")})
    items = p.stage("scan_lineitem", application=str(APPS / "q10_scan_lineitem.py"), parallelism=8,
                    inputs={"lineitem": parquet_source(lineitem or tpch + "/lineitem")})
    customers = p.stage("scan_customer", application=str(APPS / "q10_scan_customer.py"), parallelism=2,
                        inputs={"customer": parquet_source(tpch + "/customer")})
    revenue = p.stage("join_lineitem", application=str(APPS / "q10_join_lineitem.py"), parallelism=4,
                      inputs={"orders": all_to_all(orders, key="o_orderkey"),
                              "lineitem": all_to_all(items, key="l_orderkey")})
    top = p.stage("join_customer", application=str(APPS / "q10_join_customer.py"), parallelism=2,
                  inputs={"revenue": all_to_all(revenue, key="o_custkey"),
                          "customer": all_to_all(customers, key="c_custkey"),
                          "nation": broadcast(parquet_source(tpch + "/nation"))})
    p.stage("top", application=str(APPS / "q10_top.py"), parallelism=1,
            inputs={"candidates": all_to_all(top, key="c_custkey")},
            sink=ParquetSink(output + "/tpch_q10/{{ ds }}") if output else None)
    return p


with DAG(
    dag_id="tpch_q10",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example"],
):
    q10_pipeline(TPCH, LINEITEM, OUTPUT).compile()
