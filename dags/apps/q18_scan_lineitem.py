"""TPC-H Q18, stage scan_lineitem: quantity per order in this split (partial: an order's lines may span files)."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("lineitem").groupBy("l_orderkey").agg(F.sum("l_quantity").alias("quantity")))
