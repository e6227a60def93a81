"""Example: TPC-H Q9 (product type profit: green parts, per nation and year) over six tables, nine stages.

The green part keys (about 5 % of the parts) are ``broadcast`` to the scans of lineitem and partsupp,
which keep only the rows of green parts, so the other 95 % never cross an exchange (Spark's optimizer
applies the same selective join early inside one application). Line items then meet, each through
``all_to_all`` exchanges: partsupp on the two-column key (l_partkey, l_suppkey) = (ps_partkey,
ps_suppkey) (key columns are matched position by position; their names differ), orders on the order
key, then supplier on the supplier key, with nation broadcast to every subtask of that last join. A
final stage merges the partial sums per nation and year and writes them with a Parquet sink.

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
from airflow_provider_speculative.pipeline import Stage

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
APPS = HERE / "apps"
LINEITEM = os.environ.get("SPECULATIVE_EXAMPLE_DATA", str(REPO / ".data" / "tpch" / "lineitem"))
TPCH = os.environ.get("SPECULATIVE_EXAMPLE_TPCH", os.path.dirname(LINEITEM.rstrip("/")))
OUTPUT = os.environ.get("SPECULATIVE_EXAMPLE_OUTPUT", str(REPO / ".demo" / "output"))


def q9_pipeline(tpch: str, lineitem: str | None = None, output: str | None = None) -> Pipeline:
    """Q9's stages over ``tpch``/<table> (lineitem from ``lineitem`` if given); a Parquet sink under ``output``."""
    p = Pipeline("tpch_q9", default_max_parallelism=8, spark_conf={"spark.sql.shuffle.partitions": "4"})

    def scan(table: str, parallelism: int, path: str | None = None, **inputs: object) -> Stage:
        return p.stage(f"scan_{table}", application=str(APPS / f"q9_scan_{table}.py"), parallelism=parallelism,
                       inputs={table: parquet_source(path or f"{tpch}/{table}"), **inputs})

    parts = scan("part", 1)
    items = scan("lineitem", 8, lineitem, part=broadcast(parts))
    partsupp = scan("partsupp", 2, part=broadcast(parts))
    orders, suppliers = scan("orders", 4), scan("supplier", 1)
    profit = p.stage("join_partsupp", application=str(APPS / "q9_join_partsupp.py"), parallelism=4,
                     inputs={"lineitem": all_to_all(items, key=["l_partkey", "l_suppkey"]),
                             "partsupp": all_to_all(partsupp, key=["ps_partkey", "ps_suppkey"])})
    yearly = p.stage("join_orders", application=str(APPS / "q9_join_orders.py"), parallelism=4,
                     inputs={"profit": all_to_all(profit, key="l_orderkey"),
                             "orders": all_to_all(orders, key="o_orderkey")})
    by_nation = p.stage("join_supplier", application=str(APPS / "q9_join_supplier.py"), parallelism=2,
                        inputs={"profit": all_to_all(yearly, key="l_suppkey"),
                                "supplier": all_to_all(suppliers, key="s_suppkey"),
                                "nation": broadcast(parquet_source(tpch + "/nation"))})
    p.stage("final", application=str(APPS / "q9_final.py"), parallelism=1,
            inputs={"partials": all_to_all(by_nation, key=["nation", "o_year"])},
            sink=ParquetSink(output + "/tpch_q9/{{ ds }}") if output else None)
    return p


with DAG(
    dag_id="tpch_q9",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["speculative", "example"],
):
    q9_pipeline(TPCH, LINEITEM, OUTPUT).compile()
