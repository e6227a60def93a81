"""TPC-H Q1, stage 1 of the hybrid example: keep this subtask's lineitem rows shipped by the cut-off date."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

COLUMNS = ["l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_shipdate"]

with StageContext.from_argv() as ctx:
    lineitem = ctx.read("lineitem")
    ctx.write(lineitem.where(F.col("l_shipdate") <= F.date_sub(F.lit("1998-12-01").cast("date"), 90))
              .select(*COLUMNS))
