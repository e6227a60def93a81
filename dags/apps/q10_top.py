"""TPC-H Q10, stage top: the global top 20 customers by lost revenue from the join subtasks' local top 20s."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    candidates = ctx.read("candidates")
    ctx.write(candidates.orderBy(F.col("revenue").desc(), "c_custkey").limit(20).coalesce(1))
