"""TPC-H Q18, stage join_customer: big orders of this subtask's customers with the customer's name; top 100."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    orders, customers = ctx.read("orders"), ctx.read("customer")
    rows = orders.join(customers, orders["o_custkey"] == customers["c_custkey"]).select(
        "c_name", "c_custkey", "o_orderkey", "o_orderdate", "o_totalprice", "quantity")
    # o_orderkey breaks price/date ties so the top 100 is one exact answer.
    ctx.write(rows.orderBy(F.col("o_totalprice").desc(), "o_orderdate", "o_orderkey").limit(100))
