"""TPC-H Q10, stage scan_orders: this split's orders placed in 1993-10-01 .. 1993-12-31."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    # (Reading first is not required: the session exists from `with StageContext` on.)
    orders = ctx.read("orders")
    date = F.col("o_orderdate")
    orders = orders.where((date >= F.lit("1993-10-01").cast("date")) & (date < F.lit("1994-01-01").cast("date")))
    ctx.write(orders.select("o_orderkey", "o_custkey"))
