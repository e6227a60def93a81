"""TPC-H Q10, stage join_lineitem: revenue of returned items per customer, for this subtask's order keys.

A customer's orders are spread over every subtask, so this is a partial sum; join_customer merges it.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    orders, lineitem = ctx.read("orders"), ctx.read("lineitem")
    joined = lineitem.join(orders, lineitem["l_orderkey"] == orders["o_orderkey"])
    revenue = F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))
    ctx.write(joined.groupBy("o_custkey").agg(F.sum(revenue).alias("revenue")))
