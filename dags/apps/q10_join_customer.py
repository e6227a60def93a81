"""TPC-H Q10, stage join_customer: each customer's revenue in this subtask's key range, with its nation; top 20.

Every partial sum of a customer is in this subtask's range (partitioned on o_custkey), so the merged
sum is complete; nation is broadcast (25 rows), so every subtask has all of it.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    revenue = ctx.read("revenue").groupBy("o_custkey").agg(F.sum("revenue").alias("revenue"))
    customers, nation = ctx.read("customer"), ctx.read("nation")
    rows = (revenue.join(customers, revenue["o_custkey"] == customers["c_custkey"])
            .join(nation, customers["c_nationkey"] == nation["n_nationkey"])
            .select("c_custkey", "c_name", "revenue", "c_acctbal", "n_name", "c_address", "c_phone", "c_comment"))
    # c_custkey breaks revenue ties so the top 20 is one exact answer.
    ctx.write(rows.orderBy(F.col("revenue").desc(), "c_custkey").limit(20))
