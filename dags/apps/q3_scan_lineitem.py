"""TPC-H Q3, stage scan_lineitem: this split's line items shipped after 1995-03-15, with their price and discount.

Revenue (price x (1 - discount)) is computed after the join, on the few rows it keeps: the product of two
decimal(15,2) is a decimal(32,4), computed on java.math.BigDecimal and written as 14-byte binaries, while
the two factors travel through the exchange as 64-bit integers (docs/authoring.md, "Fast stages").
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    lineitem = ctx.read("lineitem").where(F.col("l_shipdate") > F.lit("1995-03-15").cast("date"))
    ctx.write(lineitem.select("l_orderkey", "l_extendedprice", "l_discount"))
