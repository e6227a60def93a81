"""TPC-H Q9, stage final: profit per nation and year, merged from the join subtasks' partial sums."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    partials = ctx.read("partials")
    totals = partials.groupBy("nation", "o_year").agg(F.sum("sum_profit").alias("sum_profit"))
    ctx.write(totals.orderBy("nation", F.col("o_year").desc()).coalesce(1))
