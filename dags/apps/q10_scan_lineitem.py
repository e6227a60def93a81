"""TPC-H Q10, stage scan_lineitem: this split's returned line items ('R') with their price and discount."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    lineitem = ctx.read("lineitem").where(F.col("l_returnflag") == "R")
    # Revenue is computed after the join, on the rows it keeps (docs/authoring.md, "Fast stages").
    ctx.write(lineitem.select("l_orderkey", "l_extendedprice", "l_discount"))
