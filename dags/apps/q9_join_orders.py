"""TPC-H Q9, stage join_orders: profit per (supplier, order year) of this subtask's order keys (partial sums)."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    profit, orders = ctx.read("profit"), ctx.read("orders")
    joined = profit.join(orders, profit["l_orderkey"] == orders["o_orderkey"])
    ctx.write(joined.groupBy("l_suppkey", "o_year").agg(F.sum("amount").alias("amount")))
