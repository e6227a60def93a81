"""TPC-H Q3, stage join_lineitem: revenue per order in this subtask's range of order keys, local top 10.

Every order key is in exactly one subtask's range (both inputs are split on it), so each group is
complete here and the global top 10 is among the union of the subtasks' top 10s.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    orders = ctx.read("orders")
    lineitem = ctx.read("lineitem")
    revenue = (
        lineitem.join(orders, lineitem["l_orderkey"] == orders["o_orderkey"])
        .groupBy("l_orderkey", "o_orderdate", "o_shippriority")
        .agg(F.sum(F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))).alias("revenue"))
    )
    # l_orderkey breaks revenue/date ties so the top 10 is one exact answer.
    top = revenue.orderBy(F.col("revenue").desc(), "o_orderdate", "l_orderkey").limit(10)
    ctx.write(top.select("l_orderkey", "revenue", "o_orderdate", "o_shippriority"))
