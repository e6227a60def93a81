"""TPC-H Q3, stage scan_orders: this split's orders placed before 1995-03-15."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    orders = ctx.read("orders").where(F.col("o_orderdate") < F.lit("1995-03-15").cast("date"))
    ctx.write(orders.select("o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"))
