"""TPC-H Q10, stage scan_lineitem: this split's returned line items ('R') with their revenue."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    lineitem = ctx.read("lineitem").where(F.col("l_returnflag") == "R")
    ctx.write(lineitem.select(
        "l_orderkey", (F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))).alias("revenue")))
