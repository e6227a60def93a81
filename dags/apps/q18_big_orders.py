"""TPC-H Q18, stage big_orders: orders in this subtask's key range whose line quantities sum above 300."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    # Every partial sum of an order is in this range (partitioned on the order key): the sum is complete.
    quantities = ctx.read("quantities").groupBy("l_orderkey").agg(F.sum("quantity").alias("quantity"))
    big = quantities.where(F.col("quantity") > 300)
    orders = ctx.read("orders")
    ctx.write(orders.join(big, orders["o_orderkey"] == big["l_orderkey"])
              .select("o_orderkey", "o_custkey", "o_orderdate", "o_totalprice", "quantity"))
