"""TPC-H Q9, stage scan_orders: order key and order year of this split's orders."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("orders").select("o_orderkey", F.year("o_orderdate").alias("o_year")))
