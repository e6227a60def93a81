"""TPC-H Q18, stage top: the global top 100 big orders from the join subtasks' local top 100s."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    candidates = ctx.read("candidates")
    ctx.write(candidates.orderBy(F.col("o_totalprice").desc(), "o_orderdate", "o_orderkey").limit(100).coalesce(1))
