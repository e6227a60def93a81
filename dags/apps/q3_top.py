"""TPC-H Q3, stage top: the global top 10 orders by revenue from the join subtasks' local top 10s."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    candidates = ctx.read("candidates")
    ctx.write(candidates.orderBy(F.col("revenue").desc(), "o_orderdate", "l_orderkey").limit(10).coalesce(1))
